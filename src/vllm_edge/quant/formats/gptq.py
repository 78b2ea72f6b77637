"""``gptq``: a symmetric 4-bit GPTQ export (no act-order) for vLLM's own GPTQ method, which runs
it as W4A8 on AMX CPUs (``int4_scaled_mm_cpu``) and as W4A16 elsewhere. The input embedding
stays bf16 (vLLM's GPTQ reads no quantized embedding); the head is untied and quantized."""

from __future__ import annotations

from typing import Any

from vllm_edge.quant.formats import WeightFormat
from vllm_edge.quant.groups import GROUPS

NAME = "gptq"

FORMAT = WeightFormat(
    name=NAME,
    summary="symmetric 4-bit GPTQ (no act-order) for vLLM's own W4A8 (AMX) / W4A16 GPTQ path",
    bits=4,
    groups=GROUPS,
    # the weight-path probe's choice for vLLM's W4A8 kernel
    default_group=64,
    encode=f"{__name__}:encode",
    quantization_config=f"{__name__}:quantization_config",
    check_shapes="vllm_edge.quant.gptq:check_model",
    quantizes_embedding=False,
    sidecars={"quantize_config.json": f"{__name__}:sidecar"},  # AutoGPTQ-style tools read it
    docs="docs/guide/quantize.md",
)


def encode(t: Any, group: int) -> tuple[dict[str, Any], Any]:
    from vllm_edge.quant import gptq

    q, scale = gptq.quantize_sym(t, group)
    tensors = gptq.pack(q, scale, group)
    return tensors, gptq.dequantize(tensors)


def quantization_config(group: int, **_: Any) -> dict[str, Any]:
    from vllm_edge.quant import gptq

    return gptq.quantization_config(group)


def sidecar(qcfg: dict[str, Any]) -> dict[str, Any]:
    return qcfg
