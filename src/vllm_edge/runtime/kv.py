"""KV-cache pricing from a model config.

vLLM's CPU backend sizes the KV cache from a byte budget. We price that
budget from the model instead of guessing: bytes per token per layer are
``2 (K and V) * kv_heads * head_dim * dtype_bytes``, and each sequence holds
``max_model_len`` tokens rounded up to whole blocks.

vLLM also holds back one block of every layer as its "null block", so the
budget includes one extra block per layer (``null_block_bytes``).

Two figures:
- ``flat``: every layer holds the full context. This is how vLLM 0.32 accounts
  today, so it is the figure to hand to ``kv_cache_memory_bytes``.
- ``hybrid``: sliding-window layers (Gemma 3) hold only their window. This is
  what the cache really needs once the allocator is hybrid-aware.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_edge.common.model_config import positive_int

DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "auto": 2,
               "float32": 4, "fp32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class KvBudget:
    flat_bytes: int
    hybrid_bytes: int
    bytes_per_token_per_layer: int
    num_layers: int
    sliding_layers: int
    sliding_window: int | None
    tokens_per_seq: int  # max_model_len rounded up to blocks
    max_num_seqs: int
    null_block_bytes: int  # one block per layer that vLLM's block pool never hands out


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _text_config(config: Any) -> Any:
    inner = _get(config, "text_config")
    return inner if inner is not None else config


def _sliding_layers(cfg: Any, n_layers: int) -> tuple[int, int | None]:
    window = _get(cfg, "sliding_window")
    layer_types = _get(cfg, "layer_types")
    if layer_types:
        return sum(1 for t in layer_types if t == "sliding_attention"), window
    if window is not None:
        window = positive_int(cfg, "sliding_window")
    if window and _get(cfg, "sliding_window_pattern") is not None:
        # Every pattern-th layer is global; the rest slide (Gemma 3 convention).
        pattern = positive_int(cfg, "sliding_window_pattern")
        return sum(1 for i in range(n_layers) if (i + 1) % pattern != 0), window
    return 0, window


def kv_heads_per_rank(config: Any, tensor_parallel_size: int = 1) -> int:
    """The KV heads one rank attends over: its share under tensor parallelism, at least one
    (vLLM replicates a head when there are fewer heads than ranks)."""
    cfg = _text_config(config)
    kv_heads = positive_int(cfg, "num_key_value_heads", positive_int(cfg, "num_attention_heads"))
    return max(1, kv_heads // tensor_parallel_size)


def kv_budget_for(config: Any, max_model_len: int, max_num_seqs: int = 1,
                  kv_dtype: str = "bfloat16", block_size: int = 16, *,
                  tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> KvBudget:
    """The budget of one rank: under tensor parallelism a rank holds its share of the KV
    heads (one whole head when there are fewer heads than ranks, as vLLM replicates them),
    under pipeline parallelism the layers of its stage (at most ceil(layers / stages))."""
    if max_model_len <= 0 or max_num_seqs <= 0 or block_size <= 0:
        raise ValueError("max_model_len, max_num_seqs and block_size must be positive")
    if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
        raise ValueError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
    cfg = _text_config(config)
    all_layers = positive_int(cfg, "num_hidden_layers")
    n_layers = math.ceil(all_layers / pipeline_parallel_size)
    n_heads = positive_int(cfg, "num_attention_heads")
    kv_heads = kv_heads_per_rank(cfg, tensor_parallel_size)
    if _get(cfg, "head_dim") is not None:
        head_dim = positive_int(cfg, "head_dim")
    else:
        head_dim = positive_int(cfg, "hidden_size") // n_heads
        if head_dim <= 0:
            positive_int({"hidden_size / num_attention_heads": head_dim},
                         "hidden_size / num_attention_heads")
    try:
        dbytes = DTYPE_BYTES[str(kv_dtype).replace("torch.", "")]
    except KeyError:
        raise ValueError(f"unknown kv dtype {kv_dtype!r}") from None
    per_tok_layer = 2 * kv_heads * int(head_dim) * dbytes
    tokens = math.ceil(max_model_len / block_size) * block_size
    null_block = n_layers * per_tok_layer * block_size
    flat = n_layers * per_tok_layer * tokens * max_num_seqs + null_block
    n_sliding, window = _sliding_layers(cfg, all_layers)
    n_sliding = min(n_sliding, n_layers)
    if n_sliding and window:
        win_tokens = min(tokens, math.ceil(int(window) / block_size) * block_size)
        hybrid = ((n_layers - n_sliding) * tokens + n_sliding * win_tokens) * per_tok_layer * max_num_seqs
        hybrid += null_block
    else:
        hybrid = flat
    return KvBudget(flat, hybrid, per_tok_layer, n_layers, n_sliding, window, tokens, max_num_seqs,
                    null_block)
