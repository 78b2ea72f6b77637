"""``cpu_int8``: our W8A16 format. Signed 8-bit codes with an fp16 scale and offset per group of
input columns, run by a native product that widens the codes in registers (AVX-512, AVX2, or a
portable loop) and, above 16 rows, by a dequantize-then-bf16-GEMM. Linears, the input embedding
and the head are all stored in it.

Lossless sources: llama.cpp's 5-, 6- and 8-bit blocks (:mod:`vllm_edge.quant.repack8`) keep
their codes; only each group's scale and offset are rounded to fp16, within the bound that
module states. A GGUF file's 4-bit tensors stay ``cpu_int4``: one checkpoint mixes the two per
layer, as the file does (``layer_formats`` in the cpu_int4 config).
"""

from __future__ import annotations

from typing import Any

from vllm_edge.quant.formats import WeightFormat

NAME = "cpu_int8"

FORMAT = WeightFormat(
    name=NAME,
    summary="W8A16: 8-bit codes, fp16 scale and offset per group; native AVX-512/AVX2 product",
    bits=8,
    groups=(16, 32, 64, 128),
    default_group=32,
    encode=f"{__name__}:encode",
    quantization_config=f"{__name__}:quantization_config",
    vllm_config="vllm_edge.quant.int8_config:CpuInt8Config",
    lossless={
        "gguf:Q8_0": "codes kept, fp16 scale kept (quant/repack8.py)",
        "gguf:Q6_K": "codes kept at group 16, sub-block scale folded and rounded to fp16 (quant/repack8.py)",
        "gguf:Q5_0": "codes kept, fp16 scale kept (quant/repack8.py)",
        "gguf:Q5_1": "codes kept, fp16 scale kept, min folded into the offset (quant/repack8.py)",
        "gguf:Q5_K": "codes kept, sub-block scales and mins folded and rounded to fp16 (quant/repack8.py)",
    },
    docs="docs/guide/quantize.md",
)


def encode(t: Any, group: int) -> tuple[dict[str, Any], Any]:
    """A bf16 weight -> its int8 codes, fp16 scales and (zero) offsets, and what they decode to."""
    from vllm_edge.quant import int8

    q, scale, zero = int8.quantize(t, group)
    return ({"weight_int8": q.contiguous(), "weight_scale": scale.contiguous(),
             "weight_zero": zero.contiguous()}, int8.dequantize(q, scale, zero, group))


def quantization_config(group: int, *, quantize_embedding: bool = True,
                        modules_to_not_convert: list[str] | None = None) -> dict[str, Any]:
    """The ``quantization_config`` every cpu_int8 writer puts in ``config.json``."""
    return {"quant_method": NAME, "bits": 8, "group_size": group,
            "quantize_embedding": quantize_embedding,
            "modules_to_not_convert": list(modules_to_not_convert or [])}
