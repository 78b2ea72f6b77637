"""Engine arguments for an edge box, built in one place for `run` (and later `serve`).

Every choice carries its reason, so `run` can print it and results can record it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_edge.runtime.kv import kv_budget_for

WORKER_EXTENSION = "vllm_edge.runtime.worker_ext.EdgeWorkerExtension"


@dataclass
class EdgeEngine:
    kwargs: dict[str, Any]
    reasons: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"engine_args": self.kwargs, "reasons": self.reasons}


def edge_engine(model_path: str | Path, *, max_model_len: int = 2048, max_num_seqs: int = 4,
                dtype: str = "bfloat16", enforce_eager: bool = False,
                kv_cache_memory_bytes: int | None = None) -> EdgeEngine:
    model_path = Path(model_path)
    config = json.loads((model_path / "config.json").read_text())
    reasons: dict[str, str] = {}
    if kv_cache_memory_bytes is None:
        budget = kv_budget_for(config, max_model_len, max_num_seqs, dtype)
        kv_cache_memory_bytes = budget.flat_bytes
        reasons["kv_cache_memory_bytes"] = (
            f"priced from the config: {budget.num_layers} layers x "
            f"{budget.bytes_per_token_per_layer} B/token x {budget.tokens_per_seq} tokens x "
            f"{max_num_seqs} seqs (vLLM's default reserves a fraction of all RAM)"
        )
    else:
        need = kv_budget_for(config, max_model_len, 1, dtype).flat_bytes
        if kv_cache_memory_bytes < need:
            raise ValueError(
                f"kv_cache_memory_bytes={kv_cache_memory_bytes} is too small for one sequence of "
                f"max_model_len={max_model_len}: the minimum is {need} bytes "
                f"({need / 2**20:.1f} MiB); raise the budget or lower max_model_len"
            )
        reasons["kv_cache_memory_bytes"] = "given explicitly"
    kwargs = {
        "model": str(model_path),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "kv_cache_memory_bytes": int(kv_cache_memory_bytes),
        "enforce_eager": enforce_eager,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    reasons["worker_extension_cls"] = "lets `run` ask the worker which patches it applied"
    reasons["enforce_eager"] = "requested" if enforce_eager else "compiled graph (cached by the AOT fix)"
    return EdgeEngine(kwargs, reasons)
