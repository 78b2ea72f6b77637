"""GGUF 5-, 6- and 8-bit blocks -> cpu_int8: every type's codes and folded scales give gguf's own
dequantization within the stated bound, and a wrong decoding (swapped nibbles, a dropped offset,
a high bit in the wrong place) fails that check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.checkpoints import K_BLOCKS, random_k_blocks
from vllm_edge.quant import repack, repack8


def raw_tensor(fmt, n=6, k=512, seed=0):
    """Raw ``fmt`` bytes [n, row bytes] and gguf's dequantization [n, k]."""
    import gguf

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[fmt]
    if fmt in K_BLOCKS:
        raw = random_k_blocks(rng, (n, k), fmt)
    else:
        raw = gguf.quants.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), qtype)
    ref = np.array(gguf.quants.dequantize(raw, qtype), np.float32).reshape(n, k)
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)), torch.from_numpy(ref)


@pytest.mark.parametrize("fmt", repack8.FORMATS)
def test_each_type_decodes_to_ggufs_values_within_the_bound(fmt):
    raw, ref = raw_tensor(fmt)
    r = repack8.decode(fmt, raw, 512, "t")
    assert r.codes.dtype == torch.int8 and r.group == repack8.BLOCKS[fmt][2]
    worst = repack8.check(r, ref, "t")
    assert 0 <= worst <= 1
    if fmt in ("Q8_0", "Q5_0"):  # fp16 scales, no offset: kept exactly
        assert worst == 0
    lo, hi = {"Q8_0": (-128, 127), "Q6_K": (-32, 31)}.get(fmt, (-16, 15))
    assert lo <= int(r.codes.min()) and int(r.codes.max()) <= hi


def _swap_nibbles(raw, at, length, block):
    b = raw.clone().view(raw.shape[0], -1, block)
    qs = b[..., at:at + length]
    b[..., at:at + length] = (qs >> 4) | ((qs & 0xF) << 4)
    return b.reshape(raw.shape[0], -1)


@pytest.mark.parametrize("fmt,broken", [
    ("Q5_0", lambda raw: _swap_nibbles(raw, 6, 16, 22)),
    ("Q5_K", lambda raw: _swap_nibbles(raw, 48, 128, 176)),
    ("Q6_K", lambda raw: _swap_nibbles(raw, 0, 128, 210)),
])
def test_swapped_nibbles_fail_the_check(fmt, broken):
    raw, ref = raw_tensor(fmt)
    with pytest.raises(repack.RepackError, match=r"tensor t: weight \(\d+, \d+\) repacks to .* over the bound"):
        repack8.check(repack8.decode(fmt, broken(raw), 512, "t"), ref, "t")


@pytest.mark.parametrize("fmt", ["Q5_1", "Q5_K"])
def test_a_dropped_offset_fails_the_check(fmt):
    raw, ref = raw_tensor(fmt)
    r = repack8.decode(fmt, raw, 512, "t")
    r.zero = torch.zeros_like(r.zero)
    with pytest.raises(repack.RepackError, match="over the bound"):
        repack8.check(r, ref, "t")


def test_a_fifth_bit_read_from_the_wrong_place_fails_the_check():
    raw, ref = raw_tensor("Q5_0")
    r = repack8.decode("Q5_0", raw, 512, "t")
    r.codes = (((r.codes.to(torch.int16) + 16) & 0xF) - 16).to(torch.int8)  # the high bit lost
    with pytest.raises(repack.RepackError, match="over the bound"):
        repack8.check(r, ref, "t")


def test_a_4_bit_tensor_carries_over_and_regroups_exactly():
    raw, ref = raw_tensor("Q4_K")
    r4 = repack.decode("Q4_K", raw, 512, "t")
    r8 = repack8.from_int4(r4).regroup(16)
    assert r8.group == 16 and r8.scale.shape[1] == 512 // 16
    assert repack8.check(r8, ref, "t") <= 1
    assert torch.equal(r8.codes.to(torch.int16) + 8, r4.codes.to(torch.int16))
    with pytest.raises(ValueError, match="cannot regroup 16 -> 32"):
        r8.regroup(32)


def test_bad_input_is_named():
    raw, _ = raw_tensor("Q8_0")
    with pytest.raises(repack.RepackError, match=r"tensor w: type Q3_K does not map onto cpu_int8 "
                                                 r"\(kept as 8-bit codes: Q8_0, Q5_0, Q5_1, Q5_K, Q6_K\)"):
        repack8.decode("Q3_K", raw, 512, "w")
    with pytest.raises(repack.RepackError, match=r"tensor w: 510 bytes per row, but 512 weights in Q8_0 take 544"):
        repack8.decode("Q8_0", raw[:, :510], 512, "w")
    with pytest.raises(repack.RepackError, match=r"tensor w: a row of 500 weights is not a whole number of "
                                                 r"Q8_0 blocks of 32"):
        repack8.decode("Q8_0", raw, 500, "w")
    bad = raw.clone()
    bad[2, 0:2] = torch.from_numpy(np.array([np.inf], np.float16).view(np.uint8))
    with pytest.raises(repack.RepackError, match=r"tensor w: d of block 0 in row 2 is not finite"):
        repack8.decode("Q8_0", bad, 512, "w")
