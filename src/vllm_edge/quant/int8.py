"""``cpu_int8`` math and its native kernel (``csrc/int8_gemv.c``).

A weight ``[N, K]`` is stored as signed 8-bit codes ``q`` with an fp16 scale ``s`` and an
fp16 offset ``z`` per group of ``g`` input columns: ``w = q * s + z``. The quantizer writes
symmetric codes (``z = 0``); the offset is there for the GGUF types whose blocks carry a
minimum (Q5_1, Q5_K, and Q4 codes stored beside them in one fused layer), so their codes
carry over unchanged (:mod:`.repack8`).

fp16, not bf16, for the scales: llama.cpp's Q8_0 and Q5_0 scales are fp16 already, so they
are kept exactly, and fp16 rounds a folded Q6_K scale 8 times closer than bf16 would.

The kernel is plain C built with the system compiler on first use (:func:`native.build_and_load`,
cached by source, compiler, flags and CPU). Without a compiler, or where it does not build,
every route below has a torch formulation: correct, slower.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from vllm_edge.quant import native

logger = logging.getLogger("vllm_edge.quant")
SOURCES = (Path(__file__).with_name("csrc") / "int8_gemv.c",)
GROUPS = (16, 32, 64, 128)
DEFAULT_GROUP = 32
QMAX = 127
_FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3", "-march=native"], ["-O3"])


def expand(t: torch.Tensor, group: int, k: int) -> torch.Tensor:
    """Per-group ``[N, K/g]`` -> per-column ``[N, K]``."""
    return t.repeat_interleave(group, dim=1)[:, :k]


def quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float weight ``[N, K]`` -> symmetric int8 codes, fp16 scales, fp16 zero offsets.

    The scale is rounded to fp16 before the codes are chosen, so each code is the nearest to
    ``w / s`` for the scale that is stored."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"cpu_int8: input size {k} is not a multiple of the group {group}")
    wf = w.detach().to(torch.float32).reshape(n, k // group, group)
    amax = wf.abs().amax(dim=-1)
    scale = (amax / QMAX).to(torch.float16)
    safe = torch.where(scale > 0, scale.to(torch.float32), torch.ones_like(amax))
    q = torch.round(wf / safe.unsqueeze(-1)).clamp_(-QMAX, QMAX).to(torch.int8).reshape(n, k)
    return q, scale, torch.zeros_like(scale)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The torch formulation: ``q * s + z`` in float32, then ``dtype``."""
    k = q.shape[1]
    w = q.to(torch.float32) * expand(scale.to(torch.float32), group, k)
    return (w + expand(zero.to(torch.float32), group, k)).to(dtype)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first use; ``None`` (logged once) if it cannot be."""
    lib, errors = native.build_and_load("int8", SOURCES, _FLAG_SETS)
    if lib is None:
        logger.warning("cpu_int8: the native kernel is unavailable (%s); running the torch "
                       "formulation (correct, slower)", " | ".join(errors))
        return None
    p, i = ctypes.c_void_p, ctypes.c_int64
    for name, args in {"edge_int8_gemv": [p] * 5 + [i] * 5, "edge_int8_dequant": [p] * 4 + [i] * 5,
                       "edge_int8_gather": [p] * 5 + [i] * 3}.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
    lib.edge_int8_openmp.restype, lib.edge_int8_openmp.argtypes = ctypes.c_int, []
    return lib


def _native_ready(*tensors: torch.Tensor) -> bool:
    return all(t.is_contiguous() for t in tensors)


def _zero_ptr(zero: torch.Tensor | None) -> int | None:
    return None if zero is None else zero.data_ptr()


def gemv(x2: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
         group: int) -> torch.Tensor | None:
    """``x2 @ W^T`` (bf16 ``[M, N]``) for bf16 ``x2`` ``[M, K]``, reading each weight row once
    per 8 activation rows (the C kernel's ROWS); ``None`` when the kernel cannot take it. ``zero`` None: symmetric."""
    lib = library()
    if lib is None or x2.dtype != torch.bfloat16 or scale.dtype != torch.float16:
        return None
    x2 = x2.contiguous()
    if not _native_ready(q, scale) or (zero is not None and not _native_ready(zero)):
        return None
    m, k = x2.shape
    n = q.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16)
    rc = lib.edge_int8_gemv(q.data_ptr(), scale.data_ptr(), _zero_ptr(zero), x2.data_ptr(),
                            y.data_ptr(), m, n, k, group, torch.get_num_threads())
    return y if rc == 0 else None


def dequantize_bf16(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                    group: int) -> torch.Tensor:
    """The whole weight as row-major bf16 ``[N, K]``: the native dequantizer, else torch."""
    lib = library()
    n, k = q.shape
    if lib is not None and scale.dtype == torch.float16 and _native_ready(q, scale) and (
            zero is None or _native_ready(zero)):
        out = torch.empty(n, k, dtype=torch.bfloat16)
        if lib.edge_int8_dequant(q.data_ptr(), scale.data_ptr(), _zero_ptr(zero), out.data_ptr(),
                                 0, n, k, group, torch.get_num_threads()) == 0:
            return out
    return dequantize(q, scale, torch.zeros_like(scale) if zero is None else zero, group,
                      torch.bfloat16)


def gather_rows(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int,
                ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the weight as bf16 ``[len(ids), K]`` (an embedding lookup). An id
    outside the table raises ``IndexError``."""
    n, k = q.shape
    flat = native.checked_ids(ids, n, "cpu_int8 embedding")
    lib = library()
    if lib is not None and scale.dtype == torch.float16 and _native_ready(q, scale) and (
            zero is None or _native_ready(zero)):
        out = torch.empty(flat.numel(), k, dtype=torch.bfloat16)
        if lib.edge_int8_gather(q.data_ptr(), scale.data_ptr(), _zero_ptr(zero), flat.data_ptr(),
                                out.data_ptr(), flat.numel(), k, group) == 0:
            return out
    z = torch.zeros_like(scale[flat]) if zero is None else zero[flat]
    return dequantize(q[flat], scale[flat], z, group, torch.bfloat16)
