"""Measurement: benchmarks, fidelity, grids, llama.cpp baselines, microbenchmarks.

Two parts are kept apart from it: ``engines/`` (engine adapters, which the agent imports
too) and ``report/`` (doc generation from the artifacts). Measurement never imports the
report, the engine adapters never import measurement, and nothing here imports the agent.
Outside the benchmarks, the report and the CLI only the agent imports from this package, and
only ``engines/``."""

# Named by string (vLLM imports it in the worker), so engines can point at it without
# importing the measurement code that the worker calls.
WORKER_EXTENSION = "vllm_edge.bench.worker.BenchWorkerExtension"
