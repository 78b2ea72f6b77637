"""GGUF 5-, 6- and 8-bit blocks -> ``cpu_int8`` codes, scales and offsets, without requantizing.

Pure tensor math on the raw block bytes of one 2-D tensor (``[N rows, row bytes]``). cpu_int8
stores ``w = c * scale + zero`` with a signed 8-bit code ``c`` per weight and one (scale, zero)
per group of input columns (:mod:`.int8`). Each type below is that affine form over its own
sub-blocks, so its integer code carries over (shifted into the signed range) and only the pair
is rewritten:

=======  ====================================  =====  ============  =====================
type     GGUF value                            group  scale         zero
=======  ====================================  =====  ============  =====================
Q8_0     ``d * q``,  q in -128..127            32     ``d``         ``0``
Q5_0     ``d * (x - 16)``, x in 0..31          32     ``d``         ``0``
Q5_1     ``d * x + m``                         32     ``d``         ``m + 16 d``
Q5_K     ``d sc_j * x - dmin m_j``             32     ``d sc_j``    ``16 d sc_j - dmin m_j``
Q6_K     ``d sc_j * (x - 32)``, x in 0..63     16     ``d sc_j``    ``0``
=======  ====================================  =====  ============  =====================

(``c = q`` for Q8_0, ``x - 16`` for the 5-bit types, ``x - 32`` for Q6_K.) A 4-bit tensor that
shares a fused layer with one of these (vLLM runs q/k/v and gate/up as one layer, in one
format) is carried over the same way from :class:`.repack.Repacked` (``c = q - 8``).

Scales and zeros are computed exactly in float64 and rounded once, to nearest, to fp16.

Bound. With ``M = |c| |s| + |z|`` per weight: a correctly rounded fp16 value is within
``2^-11`` of its exact value, relatively, when it is normal, and within ``2^-25`` absolutely
when it is subnormal; torch rounds float64 to fp16 through float32 (at most ``2^-24`` more,
relatively), and both dequantizations round in fp32. So

    |ours - gguf| <= EPS * M + TINY * (|c| + 1),   EPS = 2^-11 + 2^-20,  TINY = 2^-25,

which :func:`check` tests for every weight of a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant import int8, repack
from vllm_edge.quant.repack import RepackError, _fp16

EPS = 2.0 ** -11 + 2.0 ** -20
TINY = 2.0 ** -25
# (weights per block, bytes per block, group) of the types kept as cpu_int8
BLOCKS = {"Q8_0": (32, 34, 32), "Q5_0": (32, 22, 32), "Q5_1": (32, 24, 32),
          "Q5_K": (256, 176, 32), "Q6_K": (256, 210, 16)}
FORMATS = tuple(BLOCKS)


@dataclass
class Repacked8:
    """One tensor in cpu_int8 form: signed codes and the exact per-group scale and zero."""

    codes: torch.Tensor  # int8 [N, K]
    scale: torch.Tensor  # float64 [N, K / group], exact
    zero: torch.Tensor   # float64 [N, K / group], exact
    group: int

    def take_rows(self, index: torch.Tensor) -> "Repacked8":
        return Repacked8(self.codes[index], self.scale[index], self.zero[index], self.group)

    def regroup(self, group: int) -> "Repacked8":
        """The same weights at a smaller group that divides this one (scales repeated: exact)."""
        if group == self.group:
            return self
        if self.group % group:
            raise ValueError(f"cannot regroup {self.group} -> {group}")
        r = self.group // group
        return Repacked8(self.codes, self.scale.repeat_interleave(r, dim=1),
                         self.zero.repeat_interleave(r, dim=1), group)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of the cpu_int8 layout."""
        return {"weight_int8": self.codes.contiguous(), "weight_scale": to_fp16(self.scale),
                "weight_zero": to_fp16(self.zero)}


def to_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64).to(torch.float16).contiguous()


def from_int4(r: repack.Repacked) -> Repacked8:
    """A 4-bit repack (``(q - 8) s + z``) as 8-bit codes with the same scale and zero."""
    return Repacked8((r.codes.to(torch.int16) - 8).to(torch.int8), r.scale, r.zero, r.group)


def _blocks(fmt: str, raw: torch.Tensor, k: int, name: str) -> torch.Tensor:
    if fmt not in BLOCKS:
        raise RepackError(f"tensor {name}: type {fmt} does not map onto cpu_int8 "
                          f"(kept as 8-bit codes: {', '.join(FORMATS)})")
    per_block, block_bytes, _ = BLOCKS[fmt]
    if raw.dim() != 2 or raw.dtype != torch.uint8:
        raise RepackError(f"tensor {name}: expected raw {fmt} bytes as uint8 [rows, row bytes], "
                          f"got {raw.dtype} {list(raw.shape)}")
    if k < 1 or k % per_block:
        raise RepackError(f"tensor {name}: a row of {k} weights is not a whole number of {fmt} "
                          f"blocks of {per_block}")
    if raw.shape[1] != k // per_block * block_bytes:
        raise RepackError(f"tensor {name}: {raw.shape[1]} bytes per row, but {k} weights in {fmt} "
                          f"take {k // per_block * block_bytes}")
    return raw.contiguous().view(raw.shape[0], k // per_block, block_bytes)


def _bits(qh: torch.Tensor, count: int) -> torch.Tensor:
    """[..., bytes] -> [..., bytes * 8] of 0/1, bit ``i`` of the little-endian field first."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(*qh.shape[:-1], -1)[..., :count]


def decode(fmt: str, raw: torch.Tensor, k: int, name: str = "?") -> Repacked8:
    """Raw GGUF bytes of one [N, K] tensor in ``fmt`` -> :class:`Repacked8`."""
    b = _blocks(fmt, raw, k, name)
    n, group = b.shape[0], BLOCKS[fmt][2]
    if fmt == "Q8_0":
        d = _fp16(b, 0, name, "d")
        return Repacked8(b[..., 2:34].contiguous().view(torch.int8).reshape(n, k), d,
                         torch.zeros_like(d), group)
    if fmt in ("Q5_0", "Q5_1"):
        at = 2 if fmt == "Q5_0" else 4
        d = _fp16(b, 0, name, "d")
        high = _bits(b[..., at:at + 4], 32)                      # bit j: weight j's fifth bit
        low = repack._split_nibbles(b[..., at + 4:at + 20]).reshape(n, -1, 32)
        codes = (low | (high << 4)).to(torch.int16) - 16
        zero = torch.zeros_like(d) if fmt == "Q5_0" else _fp16(b, 2, name, "m") + 16 * d
        return Repacked8(codes.to(torch.int8).reshape(n, k), d, zero, group)
    if fmt == "Q5_K":
        d, dmin = _fp16(b, 0, name, "d").unsqueeze(-1), _fp16(b, 2, name, "dmin").unsqueeze(-1)
        sc, mn = repack.k_scales(b, 4)
        qh = b[..., 16:48]                                       # [n, blocks, 32]
        # 128 bytes = 4 runs of 32: run r holds sub-block 2r (low nibbles) and 2r + 1 (high);
        # byte l of qh holds the fifth bit of weight l of sub-block j in its bit j
        low = repack._split_nibbles(b[..., 48:176].reshape(n, -1, 4, 32)).reshape(n, -1, 8, 32)
        high = ((qh.unsqueeze(-2) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1)
        codes = (low | (high << 4)).to(torch.int16) - 16
        scale = d * sc
        zero = 16 * scale - dmin * mn
        return Repacked8(codes.to(torch.int8).reshape(n, k), scale.reshape(n, -1),
                         zero.reshape(n, -1), group)
    # Q6_K: ql[128], qh[64], 16 int8 scales, d. Each half of 128 weights reads 64 ql and 32 qh
    # bytes; weight 32 t + l of a half takes nibble (t >= 2) of ql[l + 32 (t odd)] and bits
    # 2t, 2t + 1 of qh[l]
    d = _fp16(b, 208, name, "d").unsqueeze(-1)
    ql = b[..., 0:128].reshape(n, -1, 2, 2, 32)                  # [.., half, ql run, l]
    qh = b[..., 128:192].reshape(n, -1, 2, 1, 32).to(torch.int16)
    lowt = torch.stack((ql[..., 0, :] & 0xF, ql[..., 1, :] & 0xF, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4),
                       dim=-2).to(torch.int16)                   # [.., half, t, l]
    hight = (qh >> (2 * torch.arange(4, dtype=torch.int16).view(4, 1))) & 3
    codes = (lowt | (hight << 4)) - 32
    sc = b[..., 192:208].contiguous().view(torch.int8).to(torch.float64)
    scale = d * sc
    return Repacked8(codes.to(torch.int8).reshape(n, k), scale.reshape(n, -1),
                     torch.zeros_like(scale).reshape(n, -1), group)


def dequantize(r: Repacked8) -> torch.Tensor:
    """What the cpu_int8 checkpoint holds, dequantized as :mod:`.int8` does (float32)."""
    t = r.tensors()
    return int8.dequantize(t["weight_int8"], t["weight_scale"], t["weight_zero"], r.group)


def bound(r: Repacked8) -> torch.Tensor:
    k = r.codes.shape[1]
    c = r.codes.to(torch.float64).abs()
    s, z = int8.expand(r.scale.abs(), r.group, k), int8.expand(r.zero.abs(), r.group, k)
    return EPS * (c * s + z) + TINY * (c + 1)


def check(r: Repacked8, reference: torch.Tensor, name: str = "?", *, source: str = "gguf",
          error: type[EdgeError] = RepackError) -> float:
    """Largest ``|ours - reference| / bound`` over the tensor; raises ``error`` when any weight
    is outside its bound. ``reference`` is the source type's own dequantization, [N, K]."""
    return repack.check_rows(r, reference, dequantize, bound, name, source=source, error=error)
