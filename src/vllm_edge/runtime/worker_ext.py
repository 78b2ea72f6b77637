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

    def vllm_edge_layers(self) -> dict:
        """Quantization method and cpu_int4 mode of each layer of this rank's model share."""
        model = self.model_runner.get_model()
        return {name: [type(mod.quant_method).__name__, getattr(mod, "cpu_int4_mode", None)]
                for name, mod in model.named_modules() if getattr(mod, "quant_method", None) is not None}
