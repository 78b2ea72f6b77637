"""The packed runtime layout of cpu_int8 (``csrc/lowbit_gemv.c``).

A GGUF file's Q5_0, Q5_1, Q5_K and Q6_K blocks reach ``cpu_int8`` with their codes kept
(:mod:`.repack8`): signed codes in [-16, 15] or [-32, 31] stored one byte each, 8 bits read
per weight where the file has 5.5 to 6.6. At load, a linear whose codes fit 5 or 6 bits is
repacked here (lossless: the codes, scales and offsets are the same values) into the int4
product's nibble layout plus one or two high-bit planes, and its int8 codes are freed. Decode
then reads about the file's bytes per weight, through the AVX-512 BF16 product of the int4
format with one masked add per plane.

Full 8-bit codes (Q8_0) take the same 64-row layout as two nibble planes (``planes`` 4): the
same bytes as the row-major codes, but the int4 product's instruction mix instead of
widening each byte, and the C++ op's call path instead of the Python one. An embedding is
packed too, and its rows are looked up from the packed table (:func:`gather`), so a head tied
to it runs the packed product without a second copy of the table.

On a CPU with AVX512-VNNI, every width multiplies int8 activations instead (each row rounded
per weight group, as llama.cpp rounds the activations of its Q5_0, Q6_K and Q8_0 blocks) with
VPDPBUSD, about half the instructions of the bf16 products: the high-bit planes are stored in
VPDPBUSD's byte order for this, and the bf16 product takes its k-pair's bits with one PEXT.
``VLLM_EDGE_LOWBIT_ACT8=0`` keeps the bf16 product.

Where the CPU lacks AVX512-BF16, VBMI, BW or BMI2, the kernel cannot be built, or a shape does not
fit (rows not a multiple of 64, columns of 32, a group not a multiple of 16), the layer keeps
the row-major int8 codes and cpu_int8's own products (AVX-512, AVX2 or portable): correct,
8 bits read per weight. ``VLLM_EDGE_LOWBIT=0`` keeps them everywhere.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_edge.quant import int8, native

logger = logging.getLogger("vllm_edge.quant")
SOURCES = (Path(__file__).with_name("csrc") / "lowbit_gemv.c",)
BLOCK_ROWS = 64
# planes -> the offset that makes a signed code unsigned: no plane holds [-8, 7], 1 [-16, 15],
# 2 [-32, 31]; 4 is a second nibble plane, [-128, 127]
OFFSETS = {0: 8, 1: 16, 2: 32, 4: 128}
# a part's scales are read at a coarser group where they repeat exactly, up to this width: the
# int8-activation product rounds activations per weight group, and llama.cpp's own blocks
# (Q4_K's sub-blocks, Q5_0, Q8_0) are 32 wide
MAX_GROUP = 32
# a fused layer is split into one product per part only where each extra product saves at least
# this many bytes: a call costs about 5 us (op dispatch, a thread team, the activations rounded
# again), which at this machine class's 20-30 GB/s is some 100-150 KB. Measured warm, one row:
# SmolLM2's qkv (960x576, Q5_0 q/k beside Q6_K v) ran 17.0 us in three parts against 8.3 us as
# one, 83 KB saved; the 1B Llama's (3072x2048, Q4_K q/k) 51 us against 69 us, 2.1 MB saved
MIN_SPLIT_BYTES = 256 << 10
WIDE = 4
_PACK_BLOCKS = 16


@dataclass(frozen=True)
class Packed:
    """One weight in the packed layout (shapes for ``N`` rows, ``K`` columns, group ``g``)."""

    nibbles: torch.Tensor    # uint8 [N/64, K, 32]
    high: torch.Tensor       # int32 [N/64, K/4, planes, 4, 2], read as uint64 masks (low word
                             # first); for 8-bit codes the high nibbles, [N/64, K, 32] bytes as
                             # int32 [N/64, K, 8]
    scale: torch.Tensor      # fp16 [K/g, N]
    zero: torch.Tensor | None  # fp16 [K/g, N], None when every offset is 0
    group: int
    planes: int

    @property
    def offset(self) -> int:
        return OFFSETS[self.planes]

    def nbytes(self) -> int:
        """Bytes the product reads per call: what ``bench bytes`` counts for this layer."""
        return sum(t.numel() * t.element_size()
                   for t in (self.nibbles, self.high, self.scale, self.zero) if t is not None)


def planes_for(q: torch.Tensor) -> int | None:
    """0, 1 or 2 high-bit planes when every signed code fits 4, 5 or 6 bits, else 4 (two nibble
    planes) for int8 codes; None for an empty tensor."""
    if q.numel() == 0:
        return None
    lo, hi = int(q.min()), int(q.max())
    return next((p for p, off in OFFSETS.items() if -off <= lo and hi < off), None)


@dataclass(frozen=True)
class PartSpec:
    """How one part of a layer (a shard of a fused layer, or the whole of another) is packed."""

    rows: int
    cols: int
    group: int
    planes: int | None       # the fewest planes its codes fit (None: no codes)
    zero: bool               # whether an offset is read
    packed: bool             # False: the codes stay row-major (a shape the product cannot take)

    def bits(self) -> int:
        """Bits a decode step reads for this part: 4 + planes per code (8 when row-major or for
        8-bit codes), 16 per fp16 scale, and 16 per offset when one is read."""
        code = min(4 + self.planes, 8) if self.packed else 8
        return self.rows * self.cols * code + self.rows * (self.cols // self.group) * 16 * (1 + int(self.zero))


def coarsest_group(scale: torch.Tensor, zero: torch.Tensor | None, group: int) -> int:
    """The widest group, up to :data:`MAX_GROUP` and dividing the columns, over which every
    scale and offset of ``scale``/``zero`` [N, K/group] repeats exactly: reading them at that
    group gives the same weights. A Q4_K part of a layer fused with a Q6_K one is stored at the
    layer's group 16, its values repeating in pairs."""
    k = scale.shape[1] * group
    best = group
    for wide in range(group * 2, max(MAX_GROUP, group) + 1, group):
        r = wide // group
        if wide % 16 or k % wide:
            continue
        if all(t is None or bool((t.view(t.shape[0], -1, r) == t[:, ::r, None]).all()) for t in (scale, zero)):
            best = wide
    return best


def regroup(t: torch.Tensor | None, group: int, wide: int) -> torch.Tensor | None:
    """[N, K/group] values that repeat over ``wide`` columns, read at ``wide`` (exact)."""
    return None if t is None else t[:, :: wide // group].contiguous()


def part_spec(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int) -> PartSpec:
    """How :func:`pack` would pack these codes on their own (its :meth:`PartSpec.bits`: what a
    decode step reads for them where the packed product runs); a fused layer's parts are
    settled by :func:`layout`."""
    n, k = q.shape
    wide = coarsest_group(scale, zero, group)
    planes = planes_for(q)
    packed = planes is not None and fits(n, k, wide)
    return PartSpec(n, k, wide if packed else group, planes, zero is not None and bool(zero.any()), packed)


def layout(specs: list[PartSpec]) -> list[PartSpec]:
    """The parts a layer is packed in: each part its own where the parts differ and splitting saves
    :data:`MIN_SPLIT_BYTES` per extra product, so the 4-bit rows of a large layer fused with 6-bit
    ones are not read at 6 bits; else one, at the layer's fewest planes and narrowest group for all
    its rows."""
    rows, cols = sum(s.rows for s in specs), specs[0].cols
    # every part's values repeat over the narrowest part's group (16 divides 32)
    group = min(s.group for s in specs)
    planes = None if any(s.planes is None for s in specs) else max(s.planes for s in specs)
    merged = PartSpec(rows, cols, group, planes, any(s.zero for s in specs),
                      planes is not None and fits(rows, cols, group))
    if len({(s.group, s.planes, s.zero) for s in specs}) == 1 or not all(s.packed for s in specs):
        return [merged]
    saved = (merged.bits() - sum(s.bits() for s in specs)) // 8
    return list(specs) if saved >= MIN_SPLIT_BYTES * (len(specs) - 1) else [merged]


def fits(n: int, k: int, group: int) -> bool:
    """Shapes the packed product takes (the C kernel's shape_ok)."""
    return n % BLOCK_ROWS == 0 and n > 0 and k % 32 == 0 and k > 0 and group % 16 == 0 and k % group == 0


def pack(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int,
         planes: int | None = None) -> Packed | None:
    """int8 codes ``q`` [N, K] with fp16 ``scale``/``zero`` [N, K/g] in the packed layout (the
    fewest planes the codes fit, or ``planes``), or None when the shape does not fit. Exact:
    every value kept."""
    n, k = q.shape
    if not fits(n, k, group):
        return None
    planes = planes if planes is not None else planes_for(q)
    if planes is None:
        return None
    # a few blocks at a time, so the temporaries stay small beside the weight (a 262144-row
    # embedding is 168 MB of codes)
    nb = n // BLOCK_ROWS
    nibbles = torch.empty(nb, k, 32, dtype=torch.uint8)
    if planes == WIDE:
        high = torch.empty(nb, k, 32, dtype=torch.uint8)
    else:
        high = torch.empty(nb, k // 4, planes, 4, 2, dtype=torch.int32)
        # bit 4j+t of mask (b, q, plane, i) = bit 4+plane of u at row 16i+j of block b, column
        # 4q+t: VPDPBUSD's byte order; word w of a mask holds rows j = 8w..8w+7
        weights = 1 << torch.arange(32, dtype=torch.int64)
    for b0 in range(0, nb, _PACK_BLOCKS):
        rows = q[b0 * BLOCK_ROWS:(b0 + _PACK_BLOCKS) * BLOCK_ROWS]
        blocks = (rows.to(torch.int16) + OFFSETS[planes]).to(torch.uint8).view(-1, BLOCK_ROWS, k)
        b1 = b0 + blocks.shape[0]
        nibbles[b0:b1] = _nibble_layout(blocks & 15)
        if planes == WIDE:
            high[b0:b1] = _nibble_layout(blocks >> 4)
            continue
        quarters = blocks.reshape(-1, 4, 16, k // 4, 4)                         # b, i, j, q, t
        for plane in range(planes):
            bits = ((quarters >> (4 + plane)) & 1).to(torch.int64)
            bits = bits.permute(0, 3, 1, 2, 4).reshape(-1, k // 4, 4, 2, 32)
            words = (bits * weights).sum(-1)                                      # b, q, i, w
            high[b0:b1, :, plane] = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    if planes == WIDE:
        high = high.view(torch.int32)
    zero_t = None if zero is None or not zero.any() else zero.t().contiguous()
    return Packed(nibbles, high, scale.t().contiguous(), zero_t, group, planes)


def pack_parts(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int,
               sizes: list[int]) -> list[Packed] | None:
    """A layer's codes packed as :func:`layout` says for its parts of ``sizes`` rows (vLLM's
    output partitions: q, k, v or gate, up), each at its coarsest exact group; None when the
    layer cannot be packed. Exact: every value kept."""
    if sum(sizes) != q.shape[0] or not sizes:
        sizes = [q.shape[0]]
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    parts = [(q[a:b], scale[a:b], None if zero is None else zero[a:b]) for a, b in zip(bounds, bounds[1:])]
    plan = layout([part_spec(*p, group) for p in parts])
    if len(plan) == 1:
        spec = plan[0]
        if not spec.packed:
            return None
        packed = pack(q, regroup(scale, group, spec.group), regroup(zero, group, spec.group), spec.group,
                      spec.planes)
        return None if packed is None else [packed]
    out = []
    for (pq, ps, pz), spec in zip(parts, plan):
        out.append(pack(pq, regroup(ps, group, spec.group), regroup(pz, group, spec.group), spec.group,
                        spec.planes))
    return out if all(p is not None for p in out) else None


def _nibble_layout(low: torch.Tensor) -> torch.Tensor:
    """[N/64, 64, K] nibbles as the int4 product's bytes: (b, k, j) = row j | row j+32 << 4."""
    return (low[:, :32, :] | (low[:, 32:, :] << 4)).transpose(1, 2).contiguous()


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernel, built on first use; ``None`` where it cannot be built."""
    lib, errors = native.build_and_load("lowbit", SOURCES)
    if lib is None:
        logger.info("cpu_int8: the packed product did not build (%s); 8-bit codes stay "
                    "row-major", " | ".join(errors))
        return None
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.edge_lowbit_gemv.restype, lib.edge_lowbit_gemv.argtypes = ctypes.c_int, [p] * 6 + [i] * 7
    for name in ("edge_lowbit_dequant", "edge_lowbit_dequant_t"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, [p] * 5 + [i] * 6
    lib.edge_lowbit_gather.restype, lib.edge_lowbit_gather.argtypes = ctypes.c_int, [p] * 6 + [i] * 6
    for name in ("edge_lowbit_supported", "edge_lowbit_openmp"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, []
    set_act8(lib)
    native.set_prefetch(lib, "edge_lowbit")
    return lib


def set_act8(lib: ctypes.CDLL, on: bool | None = None) -> bool:
    """Set whether ``lib`` (the ctypes kernel, or the C++ op's library that holds its own copy)
    multiplies its codes by int8 activations: ``on``, else ``VLLM_EDGE_LOWBIT_ACT8``. Returns
    whether it now does (False where it was not built with AVX512-VNNI)."""
    from vllm_edge import envs

    return native.act8_switch(lib, "edge_lowbit", envs.get("VLLM_EDGE_LOWBIT_ACT8") if on is None else on)


@functools.cache
def supported() -> bool:
    """Whether layers are packed here: ``VLLM_EDGE_LOWBIT`` on, an AVX512-BF16/VBMI/BW/BMI2 OpenMP build."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_LOWBIT"):
        return False
    lib = library()
    ok = bool(lib is not None and lib.edge_lowbit_supported() and lib.edge_lowbit_openmp())
    if lib is not None and not ok:
        logger.info("cpu_int8: the packed product needs AVX512-BF16, VBMI, BW and BMI2; 8-bit codes "
                    "stay row-major (correct, 8 bits read per weight)")
    return ok


def _zero_ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def gemv(x2: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
         zero: torch.Tensor | None, group: int, planes: int) -> torch.Tensor | None:
    """``x2 @ W^T`` (bf16 [M, N]) for bf16 ``x2`` [M, K]; None when the kernel cannot take it."""
    lib = library()
    if lib is None or x2.dtype != torch.bfloat16:
        return None
    x2 = x2.contiguous()
    m, k = x2.shape
    n = scale.shape[1]
    y = torch.empty(m, n, dtype=torch.bfloat16)
    rc = lib.edge_lowbit_gemv(nibbles.data_ptr(), high.data_ptr(), scale.data_ptr(), _zero_ptr(zero),
                              x2.data_ptr(), y.data_ptr(), m, n, k, group, planes, OFFSETS[planes],
                              torch.get_num_threads())
    return y if rc == 0 else None


def linear_t(x2: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
             zero: torch.Tensor | None, group: int, planes: int) -> torch.Tensor | None:
    """``x2 @ W^T`` through W^T dequantized to bf16 [K, N] (every store contiguous) and one
    bf16 GEMM: the prefill route. None when the kernel cannot take it."""
    lib = library()
    if lib is None or x2.dtype != torch.bfloat16:
        return None
    n, k = scale.shape[1], nibbles.shape[1]
    wt = torch.empty(k, n, dtype=torch.bfloat16)
    if lib.edge_lowbit_dequant_t(nibbles.data_ptr(), high.data_ptr(), scale.data_ptr(), _zero_ptr(zero),
                                 wt.data_ptr(), n, k, group, planes, OFFSETS[planes],
                                 torch.get_num_threads()) != 0:
        return None
    return torch.matmul(x2, wt)


def dequantize_bf16(nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
                    zero: torch.Tensor | None, group: int, planes: int) -> torch.Tensor:
    """The whole weight as row-major bf16 [N, K]: the value cpu_int8's dequantizer gives."""
    lib = library()
    n, k = scale.shape[1], nibbles.shape[1]
    if lib is not None:
        out = torch.empty(n, k, dtype=torch.bfloat16)
        if lib.edge_lowbit_dequant(nibbles.data_ptr(), high.data_ptr(), scale.data_ptr(),
                                   _zero_ptr(zero), out.data_ptr(), n, k, group, planes,
                                   OFFSETS[planes], torch.get_num_threads()) == 0:
            return out
    return unpack_codes(nibbles, high, planes).to(torch.float32).mul(
        scale.t().to(torch.float32).repeat_interleave(group, dim=1)).add(
        0 if zero is None else zero.t().to(torch.float32).repeat_interleave(group, dim=1)).to(torch.bfloat16)


def gather(ids: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
           zero: torch.Tensor | None, group: int, planes: int) -> torch.Tensor:
    """Rows ``ids`` of the packed weight as bf16 ``[len(ids), K]``: an embedding lookup, the
    values :func:`dequantize_bf16` gives. An id outside the table raises ``IndexError``."""
    n, k = scale.shape[1], nibbles.shape[1]
    flat = native.checked_ids(ids, n, "cpu_int8 embedding")
    lib = library()
    out = torch.empty(flat.numel(), k, dtype=torch.bfloat16)
    if lib is not None and lib.edge_lowbit_gather(
            nibbles.data_ptr(), high.data_ptr(), scale.data_ptr(), _zero_ptr(zero), flat.data_ptr(),
            out.data_ptr(), flat.numel(), n, k, group, planes, OFFSETS[planes]) == 0:
        return out
    # the torch route: the blocks the ids fall in, unpacked
    blocks = torch.unique(flat // BLOCK_ROWS)
    codes = unpack_codes(nibbles[blocks], high[blocks], planes).view(len(blocks), BLOCK_ROWS, k)
    where = torch.searchsorted(blocks, flat // BLOCK_ROWS)
    q = codes[where, flat % BLOCK_ROWS]
    s = scale.t()[flat]
    z = torch.zeros_like(s) if zero is None else zero.t()[flat]
    return int8.dequantize(q, s, z, group, torch.bfloat16)


def unpack_codes(nibbles: torch.Tensor, high: torch.Tensor, planes: int) -> torch.Tensor:
    """The signed int8 codes [N, K] back from the packed layout (the torch inverse of :func:`pack`)."""
    nb, k, _ = nibbles.shape
    t = nibbles.transpose(1, 2)                                              # b, j, k
    u = torch.cat([t & 15, t >> 4], dim=1).to(torch.int16)                   # b, 64, k
    if planes == WIDE:
        h = high.contiguous().view(torch.uint8).view(nb, k, 32).transpose(1, 2)
        u = u | (torch.cat([h & 15, h >> 4], dim=1).to(torch.int16) << 4)
        return (u - OFFSETS[planes]).to(torch.int8).reshape(nb * 64, k)
    words = high.to(torch.int64) & 0xFFFFFFFF                                # b, q, plane, i, w
    shifts = torch.arange(32, dtype=torch.int64)
    for plane in range(planes):
        bits = (words[:, :, plane, :, :, None] >> shifts) & 1                # b, q, i, w, 4(j%8)+t
        bits = bits.reshape(nb, k // 4, 4, 16, 4).permute(0, 2, 3, 1, 4).reshape(nb, 64, k)
        u = u | (bits.to(torch.int16) << (4 + plane))
    return (u - OFFSETS[planes]).to(torch.int8).reshape(nb * 64, k)
