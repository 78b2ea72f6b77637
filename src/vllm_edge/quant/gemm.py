"""The dtype a dequantize-then-GEMM runs in on this CPU.

torch multiplies bf16 matrices with oneDNN where the CPU has bf16 support (AVX-512 or AMX).
Without it (an AVX2-only CPU), it falls back to a scalar reference loop. There a float32 GEMM,
casts included, is several times faster: on an AVX2 EPYC, a 256x576 by 576x1536 product took
9 ms in float32 against 47 ms (weight rows contiguous) to 400 ms (weight columns contiguous) in
bf16. A bf16 weight is dequantized straight to float32 there.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def bf16_is_fast() -> bool:
    """Whether torch has a bf16 GEMM kernel for this CPU (oneDNN's bf16 check)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True  # no way to ask: keep the activations' dtype, as before


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to dequantize into and multiply in, for activations of ``dtype``."""
    return torch.float32 if dtype == torch.bfloat16 and not bf16_is_fast() else dtype
