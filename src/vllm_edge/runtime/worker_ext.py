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
