"""GPTQ 4-bit tensors -> ``cpu_int4`` codes, scales and offsets, without requantizing.

Pure tensor math on one quantized linear ``[N out, K in]`` in the standard GPTQ packing:

- ``qweight`` int32 ``[K/8, N]``: nibble ``j`` (bits ``4j..4j+3``) of ``qweight[i, n]`` is
  the code ``q[n, 8i + j]`` in 0..15;
- ``qzeros`` int32 ``[K/g, N/8]``: nibble ``j`` of ``qzeros[c, i]`` is the stored zero of
  output ``8i + j`` in group ``c``;
- ``scales`` (fp16) ``[K/g, N]``;
- ``g_idx`` int32 ``[K]`` (optional): the group of each input column.

GPTQ's value is ``w[n, k] = scale[c, n] * (q[n, k] - zero[c, n])`` with ``c = g_idx[k]``.
The zero is the stored nibble plus an offset that depends on the packing: ``checkpoint_format``
``gptq`` (AutoGPTQ's v1, what ``vllm-edge quantize --quant gptq`` writes) stores ``zero - 1``,
so zeros read back as 1..16; ``gptq_v2`` stores the zero itself (0..15). A symmetric
checkpoint (``sym: true``) has zero 8 everywhere: vLLM's GPTQ path does not read ``qzeros``
at all and uses a fixed bias of 8 (``uint4b8``), so a symmetric tensor whose zeros are not 8
is refused rather than repacked to something vLLM would not compute.

cpu_int4 stores ``w = (q - 8) * s + z`` per group of contiguous input columns (:mod:`.pack`),
so the codes carry over unchanged and

    s = scale,   z = scale * (8 - zero)     (0 for a symmetric tensor).

Groups. cpu_int4 groups are contiguous columns, so ``g_idx`` must be the trivial
``g_idx[k] = k // g``; an act-order permutation scatters a group's columns and is refused,
naming the tensor. A GPTQ group that cpu_int4 does not take (256, 512, per-channel ``-1`` =
one group of K) is split into the largest supported group that divides it (and K): every
cpu_int4 group inside one GPTQ group takes that group's scale and zero, which is exact.
A GPTQ group no supported group divides (16, say) is refused.

Bound. ``s`` and ``z`` are exact in float64 (an fp16 times an integer of 5 bits) and then
rounded once, to nearest, to bf16, cpu_int4's storage dtype: the only loss. With
``M = |q - 8| |s| + |z|`` per weight, the bf16 pair moves a weight by at most ``2^-8 M``;
GPTQ's own value is exact in fp32 and ours rounds once in fp32 (``(q-8) * s`` is exact, the
add rounds), so ``|ours - gptq| <= EPS * M`` with the same ``EPS`` as :mod:`.repack`.
A scale that is already a bf16 value (what our exporter writes) is carried exactly.

AWQ (``checkpoint_format`` ``awq``: AutoAWQ's GEMM packing, ``quant_method: awq``) holds the
same quantity, ``w = scale * (q - zero)`` with the zero stored as is, packed the other way:
``qweight`` int32 ``[K, N/8]`` and ``qzeros`` ``[K/g, N/8]`` along the outputs, with nibble ``j``
of a word holding output ``8i + AWQ_ORDER[j]`` (the interleave vLLM's CPU path undoes the
same way); ``scales`` ``[K/g, N]``. It has no ``g_idx``. Once unpacked it takes the route above.
"""

from __future__ import annotations

import torch

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant import repack
from vllm_edge.quant.groups import GROUPS
from vllm_edge.quant.repack import EPS, Repacked, bound, dequantize

__all__ = ["AWQ_ORDER", "EPS", "FORMATS", "GptqRepackError", "Repacked", "bound", "check", "decode",
           "dequantize", "dequantize_gptq", "in_features", "target_group"]

PACK = 8  # 4-bit values per int32 word
SYM_ZERO = 8
# checkpoint_format -> what is added to a stored zero nibble to get the zero
FORMATS = {"gptq": 1, "gptq_v2": 0, "awq": 0}
# AWQ's interleave: nibble j of a word holds output AWQ_ORDER[j] of its 8
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class GptqRepackError(EdgeError):
    """A GPTQ tensor or checkpoint that cannot be repacked; the message names it and says why."""


def target_group(gptq_group: int, ks: list[int], name: str = "the checkpoint") -> int:
    """The cpu_int4 group for a GPTQ group: itself when supported, else the largest supported
    group dividing it (``-1``: dividing every K in ``ks``), which splits it exactly."""
    if gptq_group == -1:
        fits = [g for g in GROUPS if all(k % g == 0 for k in ks)]
        what = "per-channel (group_size -1)"
    elif isinstance(gptq_group, int) and not isinstance(gptq_group, bool) and gptq_group > 0:
        fits = [g for g in GROUPS if gptq_group % g == 0]
        what = f"group {gptq_group}"
    else:
        raise GptqRepackError(f"{name}: group_size={gptq_group!r} is not a GPTQ group size "
                              "(a positive integer, or -1 for per-channel)")
    if not fits:
        supported = ", ".join(map(str, GROUPS))
        raise GptqRepackError(f"{name}: GPTQ {what} cannot be repacked: cpu_int4 groups are "
                              f"{supported}, and none of them divides it"
                              + (" and every input size" if gptq_group == -1 else ""))
    return max(fits)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> int64 [R, C, 8], nibble ``j`` of each word at index ``j``."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    return (words.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF


def _int32_2d(t: torch.Tensor | None, what: str, name: str) -> torch.Tensor:
    if t is None:
        raise GptqRepackError(f"tensor {name}: {what} is missing")
    if t.dim() != 2 or t.dtype != torch.int32:
        raise GptqRepackError(f"tensor {name}: {what} must be int32 2-D, got {t.dtype} {list(t.shape)}")
    return t


def _check_g_idx(g_idx: torch.Tensor | None, k: int, group: int, name: str) -> None:
    """Only the trivial ``g_idx[k] = k // group`` keeps each group's columns contiguous."""
    if g_idx is None:
        return
    if g_idx.dim() != 1 or g_idx.numel() != k:
        raise GptqRepackError(f"tensor {name}: g_idx has shape {list(g_idx.shape)}, expected [{k}]")
    trivial = torch.arange(k, dtype=torch.int64) // group
    if not torch.equal(g_idx.to(torch.int64), trivial):
        col = int((g_idx.to(torch.int64) != trivial).nonzero()[0])
        raise GptqRepackError(
            f"tensor {name}: g_idx is an act-order (desc_act) permutation (column {col} is in group "
            f"{int(g_idx[col])}, not {int(trivial[col])}); cpu_int4 groups are contiguous input "
            "columns, so a checkpoint quantized with desc_act cannot be repacked exactly")


def in_features(qweight_shape: tuple[int, ...] | list[int], checkpoint_format: str) -> int:
    """K of a packed ``qweight``: packed along K in GPTQ, along N in AWQ."""
    return qweight_shape[0] if checkpoint_format == "awq" else qweight_shape[0] * PACK


def _awq_natural(words: torch.Tensor) -> torch.Tensor:
    """AWQ-packed int32 [R, C] -> int64 [R, 8C] in output order."""
    nib = _nibbles(words)  # [R, C, 8], nibble j = output AWQ_ORDER[j]
    out = torch.empty_like(nib)
    out[..., list(AWQ_ORDER)] = nib
    return out.reshape(words.shape[0], -1)


def _unpack(t: dict[str, torch.Tensor], checkpoint_format: str, n_zero_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [N, K] int64, stored zeros [groups, N] int64 with the format's offset added)."""
    qweight, qzeros = t["qweight"], t["qzeros"]
    if checkpoint_format == "awq":
        return _awq_natural(qweight).t(), _awq_natural(qzeros)[:, :n_zero_cols]
    n, k = qweight.shape[1], qweight.shape[0] * PACK
    codes = _nibbles(qweight).permute(1, 0, 2).reshape(n, k)  # word i, nibble j -> column 8i + j
    zeros = _nibbles(qzeros).reshape(qzeros.shape[0], -1)[:, :n_zero_cols] + FORMATS[checkpoint_format]
    return codes, zeros


def decode(t: dict[str, torch.Tensor], *, group: int, sym: bool, checkpoint_format: str = "gptq",
           target: int | None = None, name: str = "?") -> Repacked:
    """GPTQ (or AWQ) tensors of one linear (keys ``qweight``, ``qzeros``, ``scales``, optional
    ``g_idx``) -> :class:`Repacked` at cpu_int4 group ``target`` (default: :func:`target_group`)."""
    if checkpoint_format not in FORMATS:
        raise GptqRepackError(f"tensor {name}: checkpoint_format {checkpoint_format!r} is not "
                              f"known; repackable: {', '.join(FORMATS)}")
    qweight = _int32_2d(t.get("qweight"), "qweight", name)
    qzeros = _int32_2d(t.get("qzeros"), "qzeros", name)
    scales = t.get("scales")
    awq = checkpoint_format == "awq"
    k = in_features(qweight.shape, checkpoint_format)
    n = qweight.shape[1] * PACK if awq else qweight.shape[1]
    g = k if group == -1 else group
    target = target_group(group, [k], f"tensor {name}") if target is None else target
    if g <= 0 or k % g or g % target:
        raise GptqRepackError(f"tensor {name}: {k} input columns are not whole GPTQ groups of {g} "
                              f"split into cpu_int4 groups of {target}")
    n_groups = k // g
    if scales is None or not scales.is_floating_point() or list(scales.shape) != [n_groups, n]:
        got = "missing" if scales is None else f"{scales.dtype} {list(scales.shape)}"
        raise GptqRepackError(f"tensor {name}: scales must be float [{n_groups}, {n}], got {got}")
    if awq and t.get("g_idx") is not None:
        raise GptqRepackError(f"tensor {name}: an AWQ checkpoint has no g_idx")
    if list(qzeros.shape) != [n_groups, -(-n // PACK)]:
        raise GptqRepackError(f"tensor {name}: qzeros has shape {list(qzeros.shape)}, expected "
                              f"[{n_groups}, {-(-n // PACK)}]")
    _check_g_idx(t.get("g_idx"), k, g, name)
    scale = scales.to(torch.float64)  # exact for fp16, bf16 and fp32
    if not torch.isfinite(scale).all():
        c, o = (~torch.isfinite(scale)).nonzero()[0].tolist()
        raise GptqRepackError(f"tensor {name}: scale of group {c}, output {o} is not finite")
    codes, zeros = _unpack({"qweight": qweight, "qzeros": qzeros}, checkpoint_format, n)
    if sym and not (zeros == SYM_ZERO).all():
        c, o = (zeros != SYM_ZERO).nonzero()[0].tolist()
        raise GptqRepackError(
            f"tensor {name}: the config says sym, but the zero of group {c}, output {o} reads "
            f"{int(zeros[c, o])} (checkpoint_format {checkpoint_format}), not {SYM_ZERO}: vLLM would "
            "ignore it and use 8; check checkpoint_format (gptq stores zero - 1, gptq_v2 the zero)")
    offset = scale * (SYM_ZERO - zeros.to(torch.float64))  # exact: fp16 x small integer
    rep = g // target
    return Repacked(codes.to(torch.uint8).contiguous(),
                    scale.t().repeat_interleave(rep, dim=1).contiguous(),
                    offset.t().repeat_interleave(rep, dim=1).contiguous(), target)


def dequantize_gptq(t: dict[str, torch.Tensor], *, group: int,
                    checkpoint_format: str = "gptq") -> torch.Tensor:
    """GPTQ's (or AWQ's) own value ``scale * (q - zero)`` per weight, float64 [N, K], gathered
    through ``g_idx`` (or ``k // group`` without one): the reference a repack is checked against."""
    scales = t["scales"]
    k, n = in_features(t["qweight"].shape, checkpoint_format), scales.shape[1]
    g = k if group == -1 else group
    codes, zeros = _unpack(t, checkpoint_format, n)
    q, zeros = codes.t().to(torch.float64), zeros.to(torch.float64)  # [K, N], [groups, N]
    g_idx = t.get("g_idx")
    col_group = g_idx.to(torch.int64) if g_idx is not None else torch.arange(k) // g
    return (scales.to(torch.float64)[col_group] * (q - zeros[col_group])).t().contiguous()


def check(r: Repacked, reference: torch.Tensor, name: str = "?") -> float:
    """Largest ``|ours - reference| / (EPS * M)`` over the tensor; raises when any weight is
    outside its bound. ``reference`` is GPTQ's value, [N, K]."""
    return repack.check(r, reference, name, source="GPTQ", error=GptqRepackError)
