"""GPTQ -> cpu_int4 repack of one tensor: the codes kept, the zero convention of each packing,
the bound held against a dequantization written here from the format definition, and the
refusals (act-order g_idx, groups cpu_int4 cannot take, a sym tensor with other zeros)."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.quant import gptq, gptq_repack, pack
from vllm_edge.quant.gptq_repack import GptqRepackError


def pack_words(v: torch.Tensor) -> torch.Tensor:
    """[R, C] of 0..15 -> int32 [R, C/8]: value ``8i + j`` of a row in bits 4j..4j+3 of word i."""
    r, c = v.shape
    out = torch.zeros(r, c // 8, dtype=torch.int64)
    for j in range(8):
        out |= v[:, j::8].to(torch.int64) << (4 * j)
    return torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32)


def make(n, k, group, *, sym, fmt="gptq", seed=0, scale_dtype=torch.float16):
    """Random codes, zeros and scales, packed as GPTQ; returns (tensors, q [N,K], zero [G,N],
    scale [G,N] float64)."""
    gen = torch.Generator().manual_seed(seed)
    g = k if group == -1 else group
    q = torch.randint(0, 16, (n, k), generator=gen)
    zero = (torch.full((k // g, n), 8) if sym
            else torch.randint(1 if fmt == "gptq" else 0, 17 if fmt == "gptq" else 16, (k // g, n),
                               generator=gen))
    scale = (torch.rand(k // g, n, generator=gen) * 0.02 + 1e-3).to(scale_dtype)
    stored = zero - gptq_repack.FORMATS[fmt]  # v1 keeps zero - 1; 16 is stored as 15
    t = {"qweight": pack_words(q).t().contiguous(),  # [K/8, N]
         "qzeros": pack_words(stored), "scales": scale,
         "g_idx": torch.arange(k, dtype=torch.int32) // g}
    return t, q, zero, scale.to(torch.float64)


def reference(q, zero, scale, group):
    """w = scale * (q - zero), each column in group k // group (the format definition)."""
    k = q.shape[1]
    g = k if group == -1 else group
    cols = torch.arange(k) // g
    return scale[cols].t() * (q.to(torch.float64) - zero[cols].t().to(torch.float64))


def test_pack_words_is_the_gptq_packing():
    """The test's own packer agrees with our exporter's (and so with the documented layout)."""
    q = torch.randint(0, 16, (16, 64))
    assert torch.equal(pack_words(q).t(), gptq._pack_rows(q.t()))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_round_trip_within_the_bound(group, sym, fmt):
    n, k = 48, 256
    t, q, zero, scale = make(n, k, group, sym=sym, fmt=fmt)
    r = gptq_repack.decode(t, group=group, sym=sym, checkpoint_format=fmt, name="w")
    assert r.group == group and torch.equal(r.codes, q.to(torch.uint8))
    ref = reference(q, zero, scale, group)
    assert torch.equal(gptq_repack.dequantize_gptq(t, group=group, checkpoint_format=fmt), ref)
    ratio = gptq_repack.check(r, ref, "w")
    assert 0 <= ratio <= 1
    ours = gptq_repack.dequantize(r).double()
    assert ((ours - ref).abs() <= gptq_repack.bound(r)).all()
    if sym:
        assert (r.tensors()["weight_zero"] == 0).all()
    else:
        assert ratio > 0  # fp16 scales times zeros do not all fit bf16: the bound is in use


def test_bf16_valued_scales_repack_exactly():
    """Our exporter stores bf16-valued scales: the sym repack is then bit-exact."""
    t, q, zero, scale = make(32, 128, 64, sym=True, scale_dtype=torch.bfloat16)
    t["scales"] = t["scales"].to(torch.float16)
    r = gptq_repack.decode(t, group=64, sym=True, name="w")
    assert torch.equal(gptq_repack.dequantize(r).double(), reference(q, zero, scale, 64))


def test_v1_zero_16_reads_back():
    """v1 stores zero - 1, so a zero of 16 (stored 15) is legal and must repack as 16."""
    t, q, zero, scale = make(16, 64, 32, sym=False)
    zero[:] = 16
    t["qzeros"] = pack_words(zero - 1)
    r = gptq_repack.decode(t, group=32, sym=False, name="w")
    gptq_repack.check(r, reference(q, zero, scale, 32), "w")
    assert torch.allclose(r.zero, -8 * r.scale)


def test_the_bound_catches_a_wrong_zero_convention():
    """Reading a v1 tensor as v2 shifts every weight by a scale: the check fails (it can)."""
    t, q, zero, scale = make(16, 64, 32, sym=False)
    r = gptq_repack.decode(t, group=32, sym=False, checkpoint_format="gptq_v2", name="w")
    with pytest.raises(GptqRepackError, match="tensor w: weight .* over the bound"):
        gptq_repack.check(r, reference(q, zero, scale, 32), "w")


@pytest.mark.parametrize("gptq_group,k,want", [(256, 512, 128), (-1, 384, 128), (-1, 192, 64),
                                               (96, 192, 32)])
def test_unsupported_groups_split_exactly(gptq_group, k, want):
    t, q, zero, scale = make(16, k, gptq_group, sym=False)
    r = gptq_repack.decode(t, group=gptq_group, sym=False, name="w")
    assert r.group == want and r.scale.shape == (16, k // want)
    gptq_repack.check(r, reference(q, zero, scale, gptq_group), "w")


@pytest.mark.parametrize("gptq_group,match", [(16, "GPTQ group 16 cannot be repacked: cpu_int4 "
                                                   "groups are 32, 64, 128"),
                                              (-1, "per-channel .* none of them divides it")])
def test_a_group_no_cpu_int4_group_divides_is_refused(gptq_group, match):
    # per-channel over K = 80: no cpu_int4 group divides 80
    t, *_ = make(16, 64 if gptq_group == 16 else 80, gptq_group, sym=True)
    with pytest.raises(GptqRepackError, match=match):
        gptq_repack.decode(t, group=gptq_group, sym=True, name="w")


def test_act_order_g_idx_is_refused_naming_the_tensor():
    t, *_ = make(16, 128, 32, sym=True)
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(1))
    t["g_idx"] = t["g_idx"][perm]
    with pytest.raises(GptqRepackError, match=r"tensor model.layers.0.mlp.up_proj: g_idx is an "
                                              r"act-order \(desc_act\) permutation"):
        gptq_repack.decode(t, group=32, sym=True, name="model.layers.0.mlp.up_proj")


def test_missing_g_idx_is_the_trivial_one():
    t, q, zero, scale = make(16, 128, 32, sym=False)
    del t["g_idx"]
    r = gptq_repack.decode(t, group=32, sym=False, name="w")
    gptq_repack.check(r, reference(q, zero, scale, 32), "w")


def test_sym_with_other_zeros_is_refused():
    t, *_ = make(16, 64, 32, sym=False, seed=3)
    with pytest.raises(GptqRepackError, match="tensor w: the config says sym, but the zero"):
        gptq_repack.decode(t, group=32, sym=True, name="w")


def test_bad_shapes_name_the_tensor():
    t, *_ = make(16, 64, 32, sym=True)
    with pytest.raises(GptqRepackError, match=r"tensor w: scales must be float \[2, 16\]"):
        gptq_repack.decode({**t, "scales": t["scales"][:1]}, group=32, sym=True, name="w")
    with pytest.raises(GptqRepackError, match="tensor w: qzeros has shape"):
        gptq_repack.decode({**t, "qzeros": t["qzeros"][:, :1]}, group=32, sym=True, name="w")
    with pytest.raises(GptqRepackError, match="tensor w: qweight must be int32"):
        gptq_repack.decode({**t, "qweight": t["qweight"].float()}, group=32, sym=True, name="w")
    with pytest.raises(GptqRepackError, match="checkpoint_format 'gptq_v3' is not known"):
        gptq_repack.decode(t, group=32, sym=True, checkpoint_format="gptq_v3", name="w")


def test_repacked_tensors_are_the_cpu_int4_layout():
    t, q, zero, scale = make(16, 64, 32, sym=False)
    p = gptq_repack.decode(t, group=32, sym=False, name="w").tensors()
    assert p["weight_packed"].dtype == torch.uint8 and p["weight_packed"].shape == (16, 32)
    assert p["weight_scale"].dtype == p["weight_zero"].dtype == torch.bfloat16
    assert torch.equal(pack.unpack_nibbles(p["weight_packed"]), q.to(torch.uint8))
