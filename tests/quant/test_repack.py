"""GGUF 4-bit blocks repacked into cpu_int4 g32: gguf's own dequantization is the reference,
and every weight must sit within the stated bound (quant/repack.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.checkpoints import random_q4_k
from vllm_edge.quant import pack, repack
from vllm_edge.quant.repack import RepackError


def _weights(rng, n: int, k: int) -> np.ndarray:
    """Rows of different scales and signs, some groups all positive or all negative (so the
    offset is far from zero), one group constant."""
    w = rng.standard_normal((n, k)) * np.exp(rng.uniform(-6, 1, size=(n, 1)))
    w[: n // 4, :64] = np.abs(w[: n // 4, :64]) + 0.5
    w[n // 4: n // 2, 32:96] = -np.abs(w[n // 4: n // 2, 32:96]) - 0.25
    w[-1, :32] = 0.125
    return w.astype(np.float32)


def _made_by_gguf(fmt: str, n: int = 96, k: int = 512, seed: int = 0):
    import gguf

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[fmt]
    raw = random_q4_k(rng, (n, k)) if fmt == "Q4_K" else gguf.quants.quantize(_weights(rng, n, k), qtype)
    return raw, gguf.quants.dequantize(raw, qtype)


@pytest.mark.parametrize("fmt", repack.FORMATS)
def test_dequantization_equals_gguf_within_the_bound(fmt):
    raw, ref = _made_by_gguf(fmt)
    r = repack.decode(fmt, torch.from_numpy(raw), ref.shape[1], "w")
    ratio = repack.check(r, torch.from_numpy(ref), "w")
    # the bound holds and is not slack: the worst weight uses most of it (a bf16 rounding can
    # cost up to 2^-8 / (1 + 2^-8) relatively, i.e. 0.996 of the bound's main term)
    assert 0.5 < ratio <= 1.0
    assert r.codes.dtype == torch.uint8 and int(r.codes.max()) <= 15
    t = r.tensors()
    assert t["weight_packed"].shape == (ref.shape[0], ref.shape[1] // 2)
    assert t["weight_scale"].dtype == t["weight_zero"].dtype == torch.bfloat16
    assert t["weight_scale"].shape == (ref.shape[0], ref.shape[1] // 32)


@pytest.mark.parametrize("fmt", repack.FORMATS)
def test_the_codes_are_gguf_codes(fmt):
    """Exact scales (float64, unrounded) reproduce gguf's values to fp32 rounding: the codes,
    their order and the affine map are right, and only the bf16 rounding is left."""
    raw, ref = _made_by_gguf(fmt, seed=1)
    r = repack.decode(fmt, torch.from_numpy(raw), ref.shape[1])
    k = ref.shape[1]
    exact = ((r.codes.double() - 8) * pack.expand_groups(r.scale, 32, k)
             + pack.expand_groups(r.zero, 32, k))
    ref64 = torch.from_numpy(ref).double()
    assert torch.allclose(exact, ref64, rtol=2 ** -22, atol=0)


def test_q4_0_has_no_offset():
    raw, _ = _made_by_gguf("Q4_0")
    assert torch.count_nonzero(repack.decode("Q4_0", torch.from_numpy(raw), 512).zero) == 0


def test_a_wrong_nibble_order_breaks_the_bound():
    """The check can fail: Q4_0 decoded with GGUF's nibble halves swapped."""
    raw, ref = _made_by_gguf("Q4_0")
    r = repack.decode("Q4_0", torch.from_numpy(raw), 512)
    swapped = r.codes.view(96, 16, 2, 16).flip(2).reshape(96, 512)
    with pytest.raises(RepackError, match=r"tensor w: weight \(\d+, \d+\) repacks to .* over the bound"):
        repack.check(repack.Repacked(swapped, r.scale, r.zero), torch.from_numpy(ref), "w")


def test_to_bf16_rounds_once():
    # 1 + 2^-8 + 2^-30: float32 rounds it to the tie 1 + 2^-8, which bf16 then rounds to 1.0;
    # the nearest bf16 is 1 + 2^-7
    x = torch.tensor([1 + 2 ** -8 + 2 ** -30, -(1 + 2 ** -8 + 2 ** -30)], dtype=torch.float64)
    assert x.to(torch.float32).to(torch.bfloat16).tolist() == [1.0, -1.0]
    assert repack.to_bf16(x).tolist() == [1 + 2 ** -7, -(1 + 2 ** -7)]
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal(20000) * np.exp(rng.uniform(-30, 30, 20000)))
    got = repack.to_bf16(x)
    bits = got.view(torch.int16)
    for step in (-1, 1):  # no neighbouring bf16 is closer
        other = (bits + step).view(torch.bfloat16).double()
        assert ((got.double() - x).abs() <= (other - x).abs()).all()
    ties = got.double() == x
    assert torch.equal(repack.to_bf16(x[ties]), x[ties].to(torch.bfloat16))


def test_rows_reorder_every_field():
    raw, _ = _made_by_gguf("Q4_1", n=8, k=64)
    r = repack.decode("Q4_1", torch.from_numpy(raw), 64)
    order = torch.tensor([3, 1, 0, 2, 7, 6, 5, 4])
    moved = r.take_rows(order)
    assert torch.equal(repack.dequantize(moved), repack.dequantize(r)[order])


@pytest.mark.parametrize("fmt,raw_shape,k,match", [
    ("Q8_0", (4, 34), 32, r"tensor blk\.0\.x: type Q8_0 does not map onto cpu_int4 g32 \(repackable: Q4_0, Q4_1, Q4_K\)"),
    ("Q4_0", (4, 27), 48, r"tensor blk\.0\.x: a row of 48 weights is not a whole number of Q4_0 blocks of 32"),
    ("Q4_K", (4, 162), 288, r"tensor blk\.0\.x: a row of 288 weights is not a whole number of Q4_K blocks of 256"),
    ("Q4_1", (4, 36), 64, r"tensor blk\.0\.x: 36 bytes per row, but 64 weights in Q4_1 take 40"),
    ("Q4_0", (36,), 64, r"tensor blk\.0\.x: expected raw Q4_0 bytes as uint8 \[rows, row bytes\]"),
])
def test_bad_input_names_the_tensor(fmt, raw_shape, k, match):
    with pytest.raises(RepackError, match=match):
        repack.decode(fmt, torch.zeros(raw_shape, dtype=torch.uint8), k, "blk.0.x")


def test_a_non_finite_scale_names_the_block():
    raw, _ = _made_by_gguf("Q4_1", n=4, k=64)
    raw = raw.copy()
    raw[2, 20:22] = np.array([np.inf], dtype=np.float16).view(np.uint8)  # d of block 1, row 2
    with pytest.raises(RepackError, match=r"tensor w: d of block 1 in row 2 is not finite"):
        repack.decode("Q4_1", torch.from_numpy(raw), 64, "w")


def test_a_reference_of_another_shape_is_refused():
    raw, ref = _made_by_gguf("Q4_0", n=4, k=64)
    r = repack.decode("Q4_0", torch.from_numpy(raw), 64)
    with pytest.raises(RepackError, match=r"tensor w: reference shape \[4, 32\]"):
        repack.check(r, torch.from_numpy(ref[:, :32]), "w")
