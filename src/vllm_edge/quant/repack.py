"""GGUF 4-bit blocks -> ``cpu_int4`` g32 codes, scales and offsets, without requantizing.

Pure tensor math on the raw block bytes of one 2-D tensor (``[N rows, row bytes]``, GGUF's
row-major order: a row is one output feature, its K input columns in blocks). cpu_int4
stores ``w = (q - 8) * scale + zero`` per group of 32 input columns (:mod:`.pack`); each
GGUF format below is already that affine form over the same 32 columns, so the integer
codes carry over unchanged and only the pair (scale, zero) is rewritten:

=======  ==========================  ================  ==========================
format   GGUF value                  cpu_int4 scale    cpu_int4 zero
=======  ==========================  ================  ==========================
Q4_0     ``d * (q - 8)``             ``d``             ``0``
Q4_1     ``d * q + m``               ``d``             ``m + 8 d``
Q4_K     ``d sc_j * q - dmin m_j``   ``d sc_j``        ``8 d sc_j - dmin m_j``
=======  ==========================  ================  ==========================

(Q4_K: ``j`` is the 32-weight sub-block of a 256-weight super-block, ``sc_j`` and ``m_j``
its 6-bit scale and min.) The scale and zero are computed exactly (float64: every product
and sum of an fp16 and a 6-bit integer fits its 53 bits) and then rounded once, to
nearest, to bf16, cpu_int4's storage dtype. That rounding is the only loss.

Bound. Let ``s``, ``z`` be the exact values and ``M = |q - 8| |s| + |z|`` per weight.
A correctly rounded bf16 value is within ``2^-8`` of its exact value, relatively, so the
rounded pair moves the weight by at most ``2^-8 M``. Both dequantizations then round in
fp32 (ours: ``(q-8) * s`` is exact, the add rounds once; gguf's numpy: one rounding for
Q4_1 and Q4_K, none for Q4_0), each at most ``2^-24 (1 + 2^-8) M``. So

    |ours - gguf| <= EPS * M,   EPS = 2^-8 + 2^-22,

which :func:`check` tests for every weight of a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant import pack

GROUP = 32
EPS = 2.0 ** -8 + 2.0 ** -22
# (weights per block, bytes per block) of the formats that map onto cpu_int4 g32
BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}
FORMATS = tuple(BLOCKS)


class RepackError(EdgeError):
    """A tensor that cannot be repacked; the message names it and says why."""


@dataclass
class Repacked:
    """One tensor in cpu_int4 form: codes in 0..15 and the exact per-group scale and zero."""

    codes: torch.Tensor  # uint8 [N, K]
    scale: torch.Tensor  # float64 [N, K / group], exact
    zero: torch.Tensor   # float64 [N, K / group], exact
    group: int = GROUP   # GGUF blocks are 32 wide; a GPTQ source keeps its own group

    def take_rows(self, index: torch.Tensor) -> "Repacked":
        """Rows reordered (every field is per output row, so a row permutation is exact)."""
        return Repacked(self.codes[index], self.scale[index], self.zero[index], self.group)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of :mod:`.pack`'s plain layout."""
        return {"weight_packed": pack.pack_nibbles(self.codes),
                "weight_scale": to_bf16(self.scale), "weight_zero": to_bf16(self.zero)}


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16 rounded once to nearest (ties to even).

    torch converts float64 to bf16 through float32, and rounding twice can land one bf16 step
    off. Rounding to float32 by round-to-odd first (truncate, then set the last bit when
    anything was dropped) keeps the second rounding exact: float32 has 16 more bits than
    bf16, more than the two that round-to-odd needs."""
    x = x.to(torch.float64)
    y = x.to(torch.float32)
    back = y.to(torch.float64)
    toward_zero = torch.where(back.abs() > x.abs(), torch.nextafter(y, torch.zeros_like(y)), y)
    bits = toward_zero.view(torch.int32)
    bits = torch.where(back != x, bits | 1, bits)
    return bits.view(torch.float32).to(torch.bfloat16)


def _blocks(fmt: str, raw: torch.Tensor, k: int, name: str) -> torch.Tensor:
    """[N, row bytes] -> [N, blocks per row, block bytes], with the checks a bad file needs."""
    if fmt not in BLOCKS:
        raise RepackError(f"tensor {name}: type {fmt} does not map onto cpu_int4 g32 "
                          f"(repackable: {', '.join(FORMATS)})")
    per_block, block_bytes = BLOCKS[fmt]
    if raw.dim() != 2 or raw.dtype != torch.uint8:
        raise RepackError(f"tensor {name}: expected raw {fmt} bytes as uint8 [rows, row bytes], "
                          f"got {raw.dtype} {list(raw.shape)}")
    if k < 1 or k % per_block:
        raise RepackError(f"tensor {name}: a row of {k} weights is not a whole number of {fmt} "
                          f"blocks of {per_block}")
    want = k // per_block * block_bytes
    if raw.shape[1] != want:
        raise RepackError(f"tensor {name}: {raw.shape[1]} bytes per row, but {k} weights in {fmt} "
                          f"take {want}")
    return raw.contiguous().view(raw.shape[0], k // per_block, block_bytes)


def _fp16(b: torch.Tensor, at: int, name: str, what: str) -> torch.Tensor:
    """The fp16 field at byte ``at`` of every block, as float64 [N, blocks]."""
    v = b[..., at:at + 2].contiguous().view(torch.float16).squeeze(-1).to(torch.float64)
    if not torch.isfinite(v).all():
        bad = (~torch.isfinite(v)).nonzero()[0].tolist()
        raise RepackError(f"tensor {name}: {what} of block {bad[1]} in row {bad[0]} is not finite")
    return v


def k_scales(b: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit (scale, min) pairs of a K-quant block, packed in 12 bytes at ``at`` (Q4_K,
    Q5_K), as int64 [..., 8]."""
    s = b[..., at:at + 12].to(torch.int64)
    lo, hi, last = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    # sub-blocks 0..3 keep their 6 bits in bytes 0..3 (scale) and 4..7 (min); 4..7 keep
    # their low 4 bits in bytes 8..11 and their top 2 bits in the spare top bits of 0..7
    sc = torch.cat((lo & 63, (last & 0xF) | ((lo >> 6) << 4)), dim=-1)
    mn = torch.cat((hi & 63, (last >> 4) | ((hi >> 6) << 4)), dim=-1)
    return sc, mn


def _split_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16 or 32 bytes] -> [..., 2, bytes]: all low nibbles, then all high nibbles
    (GGUF puts weight i in the low nibble of byte i and weight i + bytes in its high one)."""
    return torch.stack((qs & 0xF, qs >> 4), dim=-2)


def decode(fmt: str, raw: torch.Tensor, k: int, name: str = "?") -> Repacked:
    """Raw GGUF bytes of one [N, K] tensor in ``fmt`` -> :class:`Repacked`."""
    b = _blocks(fmt, raw, k, name)
    n = b.shape[0]
    if fmt == "Q4_0":
        d = _fp16(b, 0, name, "d")
        codes = _split_nibbles(b[..., 2:18])
        return Repacked(codes.reshape(n, k), d, torch.zeros_like(d))
    if fmt == "Q4_1":
        d, m = _fp16(b, 0, name, "d"), _fp16(b, 2, name, "m")
        codes = _split_nibbles(b[..., 4:20])
        return Repacked(codes.reshape(n, k), d, m + 8 * d)
    # Q4_K: d, dmin, 12 bytes of packed 6-bit (scale, min) for 8 sub-blocks, 128 bytes of codes
    d, dmin = _fp16(b, 0, name, "d").unsqueeze(-1), _fp16(b, 2, name, "dmin").unsqueeze(-1)
    sc, mn = k_scales(b, 4)
    scale = d * sc
    zero = 8 * scale - dmin * mn
    # 128 bytes = 4 runs of 32: run r holds sub-block 2r (low nibbles) and 2r + 1 (high)
    codes = _split_nibbles(b[..., 16:144].reshape(n, -1, 4, 32))
    return Repacked(codes.reshape(n, k), scale.reshape(n, -1), zero.reshape(n, -1))


def dequantize(r: Repacked) -> torch.Tensor:
    """What the cpu_int4 checkpoint holds, dequantized as :mod:`.pack` does (float32)."""
    t = r.tensors()
    return pack.dequantize_plain(t["weight_packed"], t["weight_scale"], t["weight_zero"], r.group)


def bound(r: Repacked) -> torch.Tensor:
    """``EPS * M`` per weight (float64 [N, K]); see the module docstring."""
    k = r.codes.shape[1]
    q = r.codes.to(torch.float64) - 8
    return EPS * (q.abs() * pack.expand_groups(r.scale.abs(), r.group, k)
                  + pack.expand_groups(r.zero.abs(), r.group, k))


# rows per pass of the check: float64 copies of a large embedding would take gigabytes
_CHECK_ELEMENTS = 1 << 22


def check(r: Repacked, reference: torch.Tensor, name: str = "?", *, source: str = "gguf",
          error: type[EdgeError] = RepackError) -> float:
    """Largest ``|ours - reference| / (EPS * M)`` over the tensor; raises ``error`` when any
    weight is outside its bound. ``reference`` is the source format's own dequantization
    (``source`` names it in the message), [N, K]."""
    return check_rows(r, reference, dequantize, bound, name, source=source, error=error)


def check_rows(r, reference: torch.Tensor, dequantize_rows, bound_rows, name: str, *, source: str,
               error: type[EdgeError]) -> float:
    """The check of any repacked form ``r`` (with ``codes`` [N, K] and ``take_rows``) against
    ``reference``, a block of rows at a time: largest ``|ours - reference| / bound``, or
    ``error`` naming the first weight outside its bound."""
    ref_all = torch.as_tensor(reference)
    if ref_all.shape != r.codes.shape:
        raise error(f"tensor {name}: reference shape {list(ref_all.shape)}, repacked "
                    f"{list(r.codes.shape)}")
    n, k = r.codes.shape
    step = max(1, _CHECK_ELEMENTS // max(k, 1))
    worst = 0.0
    for r0 in range(0, n, step):
        part = r.take_rows(slice(r0, r0 + step))
        ref = ref_all[r0:r0 + step].to(torch.float64)
        ours = dequantize_rows(part).to(torch.float64)
        err = (ours - ref).abs()
        lim = bound_rows(part)
        over = err > lim
        if over.any():
            i, j = over.nonzero()[0].tolist()
            raise error(f"tensor {name}: weight ({r0 + i}, {j}) repacks to {float(ours[i, j]):.9g}, "
                        f"{source} gives {float(ref[i, j]):.9g}: off by {float(err[i, j]):.3g}, "
                        f"over the bound {float(lim[i, j]):.3g}")
        ratio = torch.where(lim > 0, err / lim.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
        if ratio.numel():
            worst = max(worst, float(ratio.max()))
    return worst
