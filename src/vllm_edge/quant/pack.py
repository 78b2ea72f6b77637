"""4-bit group-wise weights: quantize, pack, repack to the CPU tinygemm layout, dequantize.

Value convention (the tinygemm one, measured against ``_weight_int4pack_mm_for_cpu``):
``w = (q - 8) * scale + zero`` with ``q`` in 0..15, one (scale, zero) pair per group
of ``group`` consecutive input columns. Round-to-nearest asymmetric quantization picks,
per group, the clipping ratio of the [min, max] range with the lowest squared error
(computed with scale and zero already rounded to bf16, as they are stored).

Checkpoint (hardware-neutral) layout of one ``[N, K]`` weight:

- ``weight_packed`` uint8 ``[N, K/2]``: byte ``(n, j)`` = ``q[n, 2j] | q[n, 2j+1] << 4``;
- ``weight_scale`` / ``weight_zero`` bf16 ``[N, ceil(K/group)]`` (the last group may be
  partial).

Packed tinygemm layout of ``torch.ops.aten._convert_weight_to_int4pack_for_cpu(w, 1)``
as measured on this torch (2.13, AVX-512) by packing index patterns and reading them
back (:func:`probe_layout`; tests/quant/test_layout.py keeps it honest):

- the output is uint8 ``[N, K/2]`` but the shape is only a view over a flat buffer of
  row blocks of ``B`` output rows; N must be a multiple of 16. ``B`` follows the vector width
  torch's kernel was dispatched to: 64 with AVX-512, 32 with AVX2 (:func:`block_n` reads it);
- a full block of ``B`` rows is stored as ``[K, B/2]`` bytes: byte ``(k, j)`` holds row ``j``
  in the low nibble and row ``j + B/2`` in the high nibble;
- a tail block of ``nb = N % B`` rows (a multiple of 16) is ``[K, nb/2]`` bytes: byte
  ``(k, j)`` holds rows ``2j`` (low) and ``2j + 1`` (high);
- ``scales_and_zeros`` is bf16 ``[K/group, N, 2]``; the kernel accepts group
  32, 64, 128, 256 with ``K % group == 0``.

Consequences: every block is independent and contiguous, so repacking works block by
block *in place* (the checkpoint layout and the packed layout have the same size), and
the packed tensor can be dequantized directly (a block unpacks to ``W^T`` columns), so
only one copy of each weight is resident. :func:`layout_matches` re-checks the closed
form once per process; if a future torch changes it, callers keep a plain copy instead.
"""

from __future__ import annotations

import functools
import math

import torch

from vllm_edge.quant.groups import KERNEL_GROUPS  # noqa: F401  (re-exported)

BLOCK_N = 64  # the widest block (AVX-512); a multiple of every block size, for aligned work
DEFAULT_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


# --- quantize -----------------------------------------------------------------------

def _pad_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> [N, G, group] plus a validity mask (the last group may be partial)."""
    n, k = w.shape
    g = math.ceil(k / group)
    pad = g * group - k
    valid = torch.ones(k, dtype=torch.bool, device=w.device)
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
        valid = torch.nn.functional.pad(valid, (0, pad), value=False)
    return w.view(n, g, group), valid.view(1, g, group)


def quantize(w: torch.Tensor, group: int, clip_ratios=DEFAULT_CLIP_RATIOS,
             chunk_rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RTN asymmetric quantization with a per-group clipping search.

    Returns ``q`` uint8 [N, K] (0..15), ``scale`` and ``zero`` bf16 [N, ceil(K/group)].
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    qs, ss, zs = [], [], []
    for r0 in range(0, n, chunk_rows):
        q, s, z = _quantize_chunk(w[r0:r0 + chunk_rows].float(), group, clip_ratios)
        qs.append(q), ss.append(s), zs.append(z)
    return torch.cat(qs), torch.cat(ss), torch.cat(zs)


def keep_best(best: tuple | None, err: torch.Tensor, *values: torch.Tensor) -> tuple:
    """One step of a per-group clip search: ``(err, *values)`` where ``err`` is below the best
    so far (``best``, None before the first candidate; ties keep the earlier), else the best."""
    if best is None:
        return (err, *values)
    better = err < best[0]
    return tuple(torch.where(better, new, old) for new, old in zip((err, *values), best))


def _quantize_chunk(w: torch.Tensor, group: int, clip_ratios):
    n, k = w.shape
    wg, valid = _pad_groups(w, group)
    wmin = wg.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
    wmax = wg.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
    best = None
    for r in clip_ratios:
        lo, hi = wmin * r, wmax * r
        s = ((hi - lo) / 15).clamp_min(1e-8).to(torch.bfloat16).float()
        z = (lo + 8 * s).to(torch.bfloat16).float()
        q = torch.round((wg - z) / s + 8).clamp_(0, 15)
        err = (((q - 8) * s + z - wg) ** 2 * valid).sum(-1, keepdim=True)
        best = keep_best(best, err, q, s, z)
    _, best_q, best_s, best_z = best
    q = best_q.reshape(n, -1)[:, :k].to(torch.uint8)
    return q, best_s.squeeze(-1).to(torch.bfloat16), best_z.squeeze(-1).to(torch.bfloat16)


# --- checkpoint (plain) layout ------------------------------------------------------

def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] in 0..15 -> [N, K/2], even column in the low nibble."""
    if q.shape[-1] % 2:
        raise ValueError(f"K={q.shape[-1]} must be even to pack two 4-bit values per byte")
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], -1)


def expand_groups(t: torch.Tensor, group: int, k: int) -> torch.Tensor:
    """[N, G] -> [N, K] by repeating each group value over its columns."""
    return t.repeat_interleave(group, dim=1)[:, :k]


def dequantize_plain(p: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                     group: int, dtype=torch.float32) -> torch.Tensor:
    """The reference: checkpoint layout -> [N, K] weights."""
    q = unpack_nibbles(p).to(torch.float32)
    k = q.shape[1]
    w = (q - 8) * expand_groups(scale.float(), group, k) + expand_groups(zero.float(), group, k)
    return w.to(dtype)


# --- tinygemm layout ----------------------------------------------------------------

def kernel_group(k: int, group: int) -> int | None:
    """The tinygemm group size that represents ``group`` exactly for width ``k``.

    A group of 128 over K=576 ends with a partial group; splitting every group into
    halves (duplicating its scale and zero) is exact, so 64 is used instead.
    """
    fits = [g for g in KERNEL_GROUPS if g <= group and group % g == 0 and k % g == 0]
    return max(fits) if fits else None


def supports(n: int, k: int, group: int) -> tuple[bool, str]:
    if n % 16:
        return False, f"output size {n} is not a multiple of 16 (tinygemm packing)"
    if k % 2:
        return False, f"input size {k} is odd"
    if kernel_group(k, group) is None:
        return False, f"input size {k} has no kernel group size dividing group {group}"
    return True, ""


def scales_and_zeros(scale: torch.Tensor, zero: torch.Tensor, group: int, k: int,
                     kgroup: int) -> torch.Tensor:
    """[N, ceil(K/group)] pairs -> tinygemm's bf16 [K/kgroup, N, 2]."""
    rep = group // kgroup
    n_k = k // kgroup
    s = scale.repeat_interleave(rep, dim=1)[:, :n_k]
    z = zero.repeat_interleave(rep, dim=1)[:, :n_k]
    return torch.stack((s, z), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)


def repack_(p: torch.Tensor, block_rows: int = 1024) -> torch.Tensor:
    """Checkpoint layout -> tinygemm layout, in place, ``block_rows`` rows at a time.

    Peak transient memory is one block as int32 (``block_rows * K * 4`` bytes).
    """
    n, half_k = p.shape
    block_rows = max(BLOCK_N, block_rows // BLOCK_N * BLOCK_N)
    flat = p.view(-1)
    for r0 in range(0, n, block_rows):
        r1 = min(n, r0 + block_rows)
        q = unpack_nibbles(p[r0:r1]).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # row blocks are contiguous in the packed buffer; r0 is 64-aligned
        flat[r0 * half_k:r1 * half_k].copy_(packed.reshape(-1))
    return p


@functools.cache
def block_n() -> int:
    """Rows per full block of the installed packing: the high nibble of the first byte holds
    row ``B/2`` (64 on AVX-512, 32 on AVX2). :data:`BLOCK_N` if it reads as neither, and then
    :func:`layout_matches` is false."""
    rows, _ = probe_layout(BLOCK_N, 2)
    b = 2 * int(rows[1])
    return b if b in (32, 64) else BLOCK_N


def _split_blocks(n: int) -> tuple[int, int]:
    b = block_n()
    full = n // b * b
    return full, n - full


def unpack_packed(packed: torch.Tensor, k: int) -> torch.Tensor:
    """tinygemm layout -> q uint8 [N, K] (closed form of the measured layout)."""
    n = packed.shape[0]
    full, tail = _split_blocks(n)
    flat = packed.reshape(-1)
    parts = []
    if full:
        bn = block_n()
        b = flat[:full * k // 2].view(full // bn, k, bn // 2)
        q = torch.cat((b & 0xF, b >> 4), dim=2)  # [nb, K, B]: W^T of each block
        parts.append(q.transpose(1, 2).reshape(full, k))
    if tail:
        b = flat[full * k // 2:].view(k, tail // 2)
        q = torch.stack((b & 0xF, b >> 4), dim=2).reshape(k, tail)
        parts.append(q.t())
    return torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()


def dequantize_packed_t(packed: torch.Tensor, sz: torch.Tensor, kgroup: int,
                        dtype=torch.bfloat16) -> torch.Tensor:
    """tinygemm layout -> ``W^T`` [K, N] in ``dtype``, straight from the packed tensor.

    A block of B rows unpacks to B contiguous columns of ``W^T``, so this writes in long
    runs; one fused multiply-add per nibble half (``(q - 8) * s + z``).
    """
    n = packed.shape[0]
    g_count = sz.shape[0]
    k = g_count * kgroup
    full, tail = _split_blocks(n)
    flat = packed.reshape(-1)
    wt = torch.empty(k, n, dtype=dtype)
    s = sz[:, :, 0].to(dtype)
    z = sz[:, :, 1].to(dtype)
    if full:
        h = block_n() // 2
        nb = full // (2 * h)
        b = flat[:full * k // 2].view(nb, g_count, kgroup, h).permute(1, 2, 0, 3)  # [G,g,nb,B/2]
        out = wt[:, :full].view(g_count, kgroup, nb, 2, h)
        sv = s[:, :full].reshape(g_count, 1, nb, 2, h)
        zv = z[:, :full].reshape(g_count, 1, nb, 2, h)
        for half, q in enumerate((b & 0xF, b >> 4)):
            q = q.view(torch.int8) - 8
            torch.addcmul(zv[..., half, :], q, sv[..., half, :], out=out[..., half, :])
    if tail:
        b = flat[full * k // 2:].view(g_count, kgroup, tail // 2)
        out = wt[:, full:].view(g_count, kgroup, tail // 2, 2)
        sv = s[:, full:].reshape(g_count, 1, tail // 2, 2)
        zv = z[:, full:].reshape(g_count, 1, tail // 2, 2)
        for half, q in enumerate((b & 0xF, b >> 4)):
            q = q.view(torch.int8) - 8
            torch.addcmul(zv[..., half], q, sv[..., half], out=out[..., half])
    return wt


def dequantize_packed(packed: torch.Tensor, sz: torch.Tensor, kgroup: int,
                      dtype=torch.bfloat16) -> torch.Tensor:
    """tinygemm layout -> [N, K] (a transposed view of :func:`dequantize_packed_t`)."""
    return dequantize_packed_t(packed, sz, kgroup, dtype).t()


def gather_rows_packed(packed: torch.Tensor, sz: torch.Tensor, kgroup: int,
                       ids: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """Rows ``ids`` of the dequantized weight (an embedding lookup) from the packed data."""
    n = packed.shape[0]
    k = sz.shape[0] * kgroup
    full, tail = _split_blocks(n)
    ids = ids.reshape(-1).long()
    flat = packed.reshape(-1)
    out = torch.empty(ids.numel(), k, dtype=dtype)
    in_full = ids < full
    if in_full.any():
        i = ids[in_full]
        bn = block_n()
        b = flat[:full * k // 2].view(full // bn, k, bn // 2)
        bytes_ = b[i // bn, :, i % (bn // 2)]  # [T, K]
        shift = ((i % bn) // (bn // 2) * 4).to(torch.uint8).unsqueeze(1)
        q = (bytes_ >> shift) & 0xF
        out[in_full] = _affine(q, sz, i, kgroup, dtype)
    if tail and (~in_full).any():
        i = ids[~in_full]
        t = i - full
        b = flat[full * k // 2:].view(k, tail // 2)
        bytes_ = b[:, t // 2].t()
        q = (bytes_ >> (t % 2 * 4).to(torch.uint8).unsqueeze(1)) & 0xF
        out[~in_full] = _affine(q, sz, i, kgroup, dtype)
    return out


def _affine(q: torch.Tensor, sz: torch.Tensor, rows: torch.Tensor, kgroup: int, dtype):
    s = sz[:, rows, 0].t().repeat_interleave(kgroup, dim=1)
    z = sz[:, rows, 1].t().repeat_interleave(kgroup, dim=1)
    return ((q.to(torch.float32) - 8) * s.float() + z.float()).to(dtype)


# --- layout measurement -------------------------------------------------------------

def probe_layout(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack index patterns 4 bits at a time and read them back.

    Returns, for every nibble of the packed buffer in memory order (byte-major, low
    nibble first), the source row and column of the [N, K] input.
    """
    idx = torch.arange(n * k, dtype=torch.int64).reshape(n, k)
    src = torch.zeros(n * k, dtype=torch.int64)
    for bit in range(0, max(1, (n * k - 1).bit_length()), 4):
        pattern = ((idx >> bit) & 0xF).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(pattern, 1)
        nib = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(-1).to(torch.int64)
        src |= nib << bit
    return src // k, src % k


def closed_form_source(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`probe_layout` should return, from the closed form in the docstring."""
    rows, cols = [], []
    full, tail = _split_blocks(n)
    h = block_n() // 2
    for b0 in range(0, full, 2 * h):
        kk = torch.arange(k).view(k, 1, 1).expand(k, h, 2)
        j = torch.arange(h).view(1, h, 1).expand(k, h, 2)
        hi = torch.arange(2).view(1, 1, 2).expand(k, h, 2)
        rows.append((b0 + j + h * hi).reshape(-1)), cols.append(kk.reshape(-1))
    if tail:
        kk = torch.arange(k).view(k, 1, 1).expand(k, tail // 2, 2)
        j = torch.arange(tail // 2).view(1, -1, 1).expand(k, tail // 2, 2)
        hi = torch.arange(2).view(1, 1, 2).expand(k, tail // 2, 2)
        rows.append((full + 2 * j + hi).reshape(-1)), cols.append(kk.reshape(-1))
    return torch.cat(rows), torch.cat(cols)


@functools.cache
def layout_matches() -> bool:
    """Once per process: does the installed kernel still use the layout we decode?"""
    for n, k in ((BLOCK_N + 48, 64), (BLOCK_N, 32), (32, 64), (48, 32)):
        pr, pc = probe_layout(n, k)
        cr, cc = closed_form_source(n, k)
        if not (torch.equal(pr, cr) and torch.equal(pc, cc)):
            return False
    return True
