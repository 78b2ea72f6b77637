"""The worker extension benchmarks start their engines with: the plugin's own
(:class:`~vllm_edge.runtime.worker_ext.EdgeWorkerExtension`) plus the measurement
calls that run inside the worker, reached through ``collective_rpc``."""

from __future__ import annotations

import os

from vllm_edge.runtime.worker_ext import EdgeWorkerExtension


class BenchWorkerExtension(EdgeWorkerExtension):
    def vllm_edge_ledger(self, top: int = 10) -> dict:
        from vllm_edge.bench.ledger import ledger

        runner = self.model_runner
        return ledger(runner.get_model(), getattr(runner, "kv_caches", ()), top=top)

    def vllm_edge_profile_marks(self, on: bool = True) -> dict:
        """Add (or remove) the `bench profile` ranges on the model's modules and vLLM's
        sampler; reports this worker's pid, so the caller can check it shares its process."""
        from vllm_edge.bench.profile import install_marks

        for h in getattr(self, "_edge_profile_hooks", ()):
            h.remove()
        self._edge_profile_hooks: list = []
        counts: dict[str, int] = {}
        if on:
            runner = self.model_runner
            modules = list(runner.get_model().modules())
            sampler = getattr(runner, "sampler", None)
            if sampler is not None:
                modules += list(sampler.modules())
            self._edge_profile_hooks, counts = install_marks(modules)
        return {"pid": os.getpid(), "groups": counts}

    def vllm_edge_int4_dispatch(self, calls: int = 2000) -> dict | None:
        """Microseconds per call of the cpu_int4 linear at one row on the model's first int4
        layer, through each layer of its call path; None when the model has no such layer."""
        from vllm_edge.bench.step import int4_dispatch

        return int4_dispatch(self.model_runner.get_model(), calls)
