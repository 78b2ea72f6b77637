"""``cpu_int4``: our W4A16 format. Unsigned 4-bit codes with a bf16 scale and offset per group of
input columns, packed for torch's tinygemm, run by a native AVX512-BF16 product straight from
the packed weights (or tinygemm, then a dequantize-then-bf16-GEMM above a row threshold, on CPUs
without it). Linears, the input embedding and the head (untied when tied) are all quantized.

Lossless sources: llama.cpp's Q4_0, Q4_1 and Q4_K blocks (:mod:`vllm_edge.quant.repack`) and
GPTQ/AWQ 4-bit codes (:mod:`vllm_edge.quant.gptq_repack`) keep their codes; only each group's
scale and offset are rounded to bf16, within the bound those modules state.
"""

from __future__ import annotations

from typing import Any

from vllm_edge.quant.formats import WeightFormat
from vllm_edge.quant.groups import DEFAULT_GROUP, GROUPS

NAME = "cpu_int4"

FORMAT = WeightFormat(
    name=NAME,
    summary="W4A16: 4-bit codes, bf16 scale and offset per group; native AVX512-BF16 product",
    bits=4,
    groups=GROUPS,
    default_group=DEFAULT_GROUP,
    encode=f"{__name__}:encode",
    quantization_config=f"{__name__}:quantization_config",
    vllm_config="vllm_edge.quant.config:CpuInt4Config",
    vision=True,
    lossless={
        "gguf:Q4_0": "codes kept, fp16 scale rounded to bf16 (quant/repack.py)",
        "gguf:Q4_1": "codes kept, fp16 scale and min rounded to bf16 (quant/repack.py)",
        "gguf:Q4_K": "codes kept, sub-block scales and mins folded and rounded to bf16 (quant/repack.py)",
        "gptq": "codes kept at the checkpoint's group, no act-order (quant/gptq_repack.py)",
        "awq": "codes kept, AWQ's interleave undone, zero points required (quant/gptq_repack.py)",
    },
    docs="docs/guide/quantize.md",
)


def encode(t: Any, group: int) -> tuple[dict[str, Any], Any]:
    """A bf16 weight -> its packed codes, scales and offsets, and what they decode to."""
    from vllm_edge.quant import pack

    q, scale, zero = pack.quantize(t, group)
    packed = pack.pack_nibbles(q)
    tensors = {"weight_packed": packed, "weight_scale": scale.contiguous(),
               "weight_zero": zero.contiguous()}
    return tensors, pack.dequantize_plain(packed, scale, zero, group)


def quantization_config(group: int, *, quantize_embedding: bool = True,
                        modules_to_not_convert: list[str] | None = None) -> dict[str, Any]:
    """The ``quantization_config`` every cpu_int4 writer puts in ``config.json``."""
    from vllm_edge.quant.ops import AUTO_NAME, DEFAULT_WORKSPACE_MB

    return {"quant_method": NAME, "bits": 4, "group_size": group,
            "quantize_embedding": quantize_embedding, "prefill_dequant": True,
            "dequant_threshold": AUTO_NAME, "direct_dequant": True,
            "dequant_workspace_mb": DEFAULT_WORKSPACE_MB,
            "modules_to_not_convert": list(modules_to_not_convert or [])}
