"""Worker extension (vLLM's ``worker_extension_cls``): lets the driver ask a
worker process what the plugin did there, through ``collective_rpc``."""

from __future__ import annotations


class EdgeWorkerExtension:
    def vllm_edge_report(self) -> dict:
        from vllm_edge import plugin

        return plugin.process_report()

    def vllm_edge_release(self, tag: str = "rpc") -> dict:
        from vllm_edge.runtime.memory import release_arenas

        return release_arenas(tag).to_dict()

    def vllm_edge_ledger(self, top: int = 10) -> dict:
        from vllm_edge.harness.ledger import ledger

        runner = self.model_runner
        return ledger(runner.get_model(), getattr(runner, "kv_caches", ()), top=top)

    def vllm_edge_profile_marks(self, on: bool = True) -> dict:
        """Add (or remove) the `bench profile` ranges on the model's modules and vLLM's
        sampler; reports this worker's pid, so the caller can check it shares its process."""
        import os

        from vllm_edge.harness.profile import install_marks

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
