"""Quantize / pack / unpack / dequantize on the checkpoint and the packed layouts."""

from __future__ import annotations

import pytest
import torch

from support.int4_weights import packed_weights
from vllm_edge.quant import pack


def test_nibble_round_trip():
    q = torch.randint(0, 16, (32, 70), dtype=torch.uint8)
    p = pack.pack_nibbles(q)
    assert p.shape == (32, 35) and p.dtype == torch.uint8
    assert torch.equal(pack.unpack_nibbles(p), q)
    assert int(p[0, 0]) == int(q[0, 0]) | int(q[0, 1]) << 4


def test_odd_k_is_rejected():
    with pytest.raises(ValueError, match="even"):
        pack.pack_nibbles(torch.zeros(4, 5, dtype=torch.uint8))


@pytest.mark.parametrize("k,group", [(256, 64), (256, 128), (576, 128), (200, 64), (576, 32), (200, 32)])
def test_quantize_error_and_partial_groups(k, group):
    w = torch.randn(64, k) * 0.02
    q, s, z = pack.quantize(w, group)
    assert q.shape == (64, k) and int(q.max()) <= 15
    assert s.shape == z.shape == (64, -(-k // group))
    deq = pack.dequantize_plain(pack.pack_nibbles(q), s, z, group)
    snr = 10 * torch.log10(w.pow(2).sum() / (w - deq).pow(2).sum())
    assert snr > 18  # 4-bit RTN on Gaussian weights gives ~20-21 dB


def test_clip_search_never_worse_than_minmax():
    w = torch.randn(128, 256) * 0.02
    w[0, 3] = 1.0  # an outlier makes clipping worthwhile
    err = {}
    for ratios in ((1.0,), pack.DEFAULT_CLIP_RATIOS):
        q, s, z = pack.quantize(w, 64, clip_ratios=ratios)
        err[ratios] = (pack.dequantize_plain(pack.pack_nibbles(q), s, z, 64) - w).pow(2).sum()
    assert err[pack.DEFAULT_CLIP_RATIOS] <= err[(1.0,)]


def _q4_1_grid(n, k, seed=0):
    """Weights on an asymmetric 4-bit grid in blocks of 32 (llama.cpp Q4_1's layout), with
    every value exact in bf16, each block using both ends of its range (as Q4_1's min/max
    rounding does): w = (q - 8) * d + z."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g)
    q[..., 0], q[..., 1] = 0, 15
    d = torch.randint(1, 16, (n, k // 32, 1), generator=g) * 2.0 ** -12
    z = torch.randint(-100, 101, (n, k // 32, 1), generator=g) * 2.0 ** -12
    w = ((q - 8) * d + z).reshape(n, k)
    assert torch.equal(w.to(torch.bfloat16).float(), w)
    return w.to(torch.bfloat16), q.reshape(n, k)


def test_group_32_recovers_a_q4_1_grid_exactly():
    """The clip search must keep the exact min/max candidate: on weights that already sit
    on a 32-wide 4-bit grid (SmolLM2's bf16 is a dequantized Q4_1), g32 reproduces them
    bit for bit, while g64 cannot (two blocks' grids do not share one scale)."""
    w, q_true = _q4_1_grid(64, 256)
    q, s, z = pack.quantize(w, 32)
    assert torch.equal(q.long(), q_true)
    assert torch.equal(pack.dequantize_plain(pack.pack_nibbles(q), s, z, 32), w.float())
    q64, s64, z64 = pack.quantize(w, 64)
    assert not torch.equal(pack.dequantize_plain(pack.pack_nibbles(q64), s64, z64, 64), w.float())


@pytest.mark.parametrize("k,group,expected", [(576, 128, 64), (4096, 128, 128), (576, 64, 64), (96, 64, 32), (40, 64, None),
                                                    (576, 32, 32), (40, 32, None)])
def test_kernel_group(k, group, expected):
    assert pack.kernel_group(k, group) == expected


@pytest.mark.parametrize("n,k,group", [(576, 1536, 128), (1536, 576, 128), (112, 256, 64), (48, 128, 128),
                                       (1536, 576, 32), (112, 256, 32)])
def test_packed_dequant_and_gather_match_reference(n, k, group):
    p, sz, kg, ref, _ = packed_weights(n, k, group)
    # bf16 outputs: within half an ulp of the fp32 reference
    tol = ref.abs().max().item() * 2 ** -8
    assert (pack.dequantize_packed(p, sz, kg).float() - ref).abs().max() <= tol
    ids = torch.tensor([0, n - 1, n // 2, 33, n - 5])
    assert (pack.gather_rows_packed(p, sz, kg, ids).float() - ref[ids]).abs().max() <= tol
