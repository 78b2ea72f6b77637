"""Measurement: benchmarks, fidelity, grids, llama.cpp baselines, microbenchmarks, reports.

Nothing outside the benchmarks and the CLI imports this package."""

# Named by string (vLLM imports it in the worker), so engines can point at it without
# importing the measurement code that the worker calls.
WORKER_EXTENSION = "vllm_edge.bench.worker.BenchWorkerExtension"
