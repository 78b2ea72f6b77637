"""Measurement harness: benchmarks, memory, provenance."""
