"""Symmetric 4-bit weights in the standard GPTQ checkpoint format (``--quant gptq``).

This is the format vLLM's own CPU paths read: ``int4_scaled_mm_cpu`` (W4A8, AMX only)
and ``cpu_gemm_wna16`` elsewhere. Weights are rounded to nearest with a per-group
clipping search (no Hessian calibration; the *format* is GPTQ's, ``desc_act: false``).

Per quantized ``[N, K]`` weight ``<m>.weight`` (GPTQ "v1" packing, as AutoGPTQ writes it):

- ``<m>.qweight`` int32 ``[K/8, N]``: nibble ``j`` (bits ``4j..4j+3``) of ``qweight[i, n]``
  is ``q[n, 8i + j]``, q in 0..15;
- ``<m>.scales`` fp16 ``[K/g, N]``;
- ``<m>.qzeros`` int32 ``[K/g, N/8]``: nibble ``j`` of ``qzeros[g, i]`` is
  ``zero[g, 8i + j] - 1`` (the v1 off-by-one); symmetric means ``zero = 8`` everywhere;
- ``<m>.g_idx`` int32 ``[K]``: ``k // g`` (no act-order).

``w[n, k] = (q[n, k] - 8) * scales[k // g, n]``. Scales are rounded to bf16 values before
they are stored in fp16 (exact for normal fp16 numbers), so vLLM, which keeps them in the
model dtype, dequantizes to exactly the reference.
"""

from __future__ import annotations

import torch

from vllm_edge.quant.pack import keep_best

BITS = 4
PACK = 32 // BITS
SYM_ZERO = 8
FP16_MIN_NORMAL = 2.0 ** -14
DEFAULT_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


def check_shape(name: str, n: int, k: int, group: int) -> None:
    """GPTQ needs whole groups and whole int32 words on both axes."""
    if k % group:
        raise ValueError(f"gptq: {name} has {k} input columns, not a multiple of group {group}; "
                         f"use a group size that divides {k}")
    if k % PACK or n % PACK:
        raise ValueError(f"gptq: {name} is [{n}, {k}]; both sizes must be multiples of {PACK}")


def quantize_sym(w: torch.Tensor, group: int, clip_ratios=DEFAULT_CLIP_RATIOS,
                 chunk_rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] -> ``q`` uint8 [N, K] (0..15) and ``scale`` float32 [N, K/group]."""
    n, k = w.shape
    qs, ss = [], []
    for r0 in range(0, n, chunk_rows):
        wg = w[r0:r0 + chunk_rows].float().view(-1, k // group, group)
        amax = wg.abs().amax(-1, keepdim=True)
        best = None
        for r in clip_ratios:
            s = (amax * r * 2 / 15).clamp_min(FP16_MIN_NORMAL).to(torch.bfloat16).float()
            q = torch.round(wg / s + SYM_ZERO).clamp_(0, 15)
            err = (((q - SYM_ZERO) * s - wg) ** 2).sum(-1, keepdim=True)
            best = keep_best(best, err, q, s)
        _, best_q, best_s = best
        qs.append(best_q.reshape(-1, k).to(torch.uint8))
        ss.append(best_s.squeeze(-1))
    return torch.cat(qs), torch.cat(ss)


def _pack_rows(v: torch.Tensor) -> torch.Tensor:
    """[R, C] values 0..15 -> int32 [R/8, C], value ``8i + j`` of a column in nibble ``j``."""
    r, c = v.shape
    v = v.to(torch.int64).view(r // PACK, PACK, c)
    shifts = torch.arange(0, 32, BITS, dtype=torch.int64).view(1, PACK, 1)
    words = (v << shifts).sum(1)
    return (words - (words >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32)


def _unpack_rows(words: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32).view(1, PACK, 1)
    v = (words.unsqueeze(1) >> shifts) & 0xF
    return v.reshape(-1, words.shape[1])


def pack(q: torch.Tensor, scale: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """``q`` [N, K], ``scale`` [N, K/group] -> the four GPTQ tensors (suffixes as keys)."""
    n, k = q.shape
    zeros = torch.full((n, k // group), SYM_ZERO - 1, dtype=torch.int64)  # v1: zero - 1
    return {
        "qweight": _pack_rows(q.t()),
        "qzeros": _pack_rows(zeros).t().contiguous(),
        "scales": scale.t().contiguous().to(torch.float16),
        "g_idx": (torch.arange(k, dtype=torch.int32) // group),
    }


def dequantize(t: dict[str, torch.Tensor], dtype=torch.float32) -> torch.Tensor:
    """The reference: GPTQ tensors -> ``w`` [N, K], read back from the packed words."""
    q = _unpack_rows(t["qweight"]).to(torch.float32)  # [K, N]
    zeros = _unpack_rows(t["qzeros"].t().contiguous()).t().to(torch.float32) + 1  # [G, N]
    g = t["g_idx"].long()
    w_t = (q - zeros[g]) * t["scales"].float()[g]
    return w_t.t().contiguous().to(dtype)


def quantization_config(group: int) -> dict:
    return {"quant_method": "gptq", "bits": BITS, "group_size": group, "desc_act": False,
            "sym": True, "lm_head": True, "checkpoint_format": "gptq", "static_groups": False,
            "true_sequential": True}


def check_model(shapes: dict[str, tuple[int, int]], group: int) -> None:
    """Fail before any work when some weight cannot be stored; one message names them all."""
    bad = []
    for name in sorted(shapes):
        try:
            check_shape(name, *shapes[name], group)
        except ValueError as exc:
            bad.append((name, str(exc)))
    if bad:
        others = ", ".join(n for n, _ in bad[1:])
        raise ValueError(f"{bad[0][1]}" + (f" (also: {others})" if others else ""))
