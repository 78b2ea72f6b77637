"""cpu_int8's packed layout: the packing is exact, the product, the prefill route and the row
lookup equal the int8 formulation they replace, a wrong plane is caught, and vLLM's layers and
embeddings pack at load (freeing their int8 codes), 4-, 5- and 6-bit codes at their own width
and 8-bit ones as two nibble planes; a fused layer whose parts differ, part by part."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.quant import int8, int8_ops, lowbit, lowbit_op

needs_kernel = pytest.mark.skipif(not lowbit.supported(),
                                  reason="the packed product needs AVX512-BF16, VBMI and BW")


def codes(n, k, group, planes, seed=0, offsets=True):
    g = torch.Generator().manual_seed(seed)
    off = lowbit.OFFSETS[planes]
    q = torch.randint(-off, off, (n, k), generator=g, dtype=torch.int16).to(torch.int8)
    s = (torch.rand(n, k // group, generator=g) * 1e-2 + 1e-4).to(torch.float16)
    z = ((torch.rand(n, k // group, generator=g) - 0.5) * 1e-2).to(torch.float16) if offsets else None
    return q, s, z


def reference(x, q, s, z, group):
    zz = torch.zeros_like(s) if z is None else z
    return x.double() @ int8.dequantize(q, s, zz, group).double().T


def act8_reference(x, q, s, z, group):
    """The int8-activation product: each row of x rounded per group as the kernel's rule says (step max|x| / 127 in fp32, nearest, ties to even), exact integer dots."""
    xf = x.float().view(x.shape[0], -1, group)
    step = xf.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    xq = torch.round(xf * inv).clamp(-127, 127).double()
    dots = torch.einsum("mgk,ngk->mng", xq, q.double().view(q.shape[0], -1, group))
    y = (dots * s.double()[None] * step.double().squeeze(-1)[:, None, :]).sum(-1)
    if z is not None:
        y = y + (z.double()[None] * xf.double().sum(-1)[:, None, :]).sum(-1)
    return y


def act8_on():
    lib = lowbit.library()
    return bool(lib is not None and lib.edge_lowbit_act8())


def want(x, q, s, z, group, planes):
    """What the product should give: int8 activations where the kernel takes them."""
    return act8_reference(x, q, s, z, group) if act8_on() else reference(x, q, s, z, group)


def close(y, ref, k):
    # bf16 output rounding plus fp32 accumulation over k terms of (128 + u) x, each up to 192 |x|
    bound = ref.abs() * 2 ** -8 + (ref.abs().max() + 1e-3) * k * 2 ** -18
    return bool(((y.double() - ref).abs() <= bound).all())


@pytest.mark.parametrize("planes", [0, 1, 2, 4])
def test_packing_is_exact_and_finds_the_planes(planes):
    q, s, z = codes(192, 96, 32, planes)
    assert lowbit.planes_for(q) == planes
    p = lowbit.pack(q, s, z, 32)
    assert p.planes == planes and p.offset == {0: 8, 1: 16, 2: 32, 4: 128}[planes]
    assert torch.equal(lowbit.unpack_codes(p.nibbles, p.high, planes), q)
    assert torch.equal(p.scale, s.t()) and torch.equal(p.zero, z.t())
    # 4 + planes bits per code (8 for two nibble planes), fp16 scale and offset per group of 32
    assert p.nbytes() * 8 == 192 * 96 * min(4 + planes, 8) + 2 * 16 * 192 * 3
    assert lowbit.part_spec(q, s, z, 32).bits() == p.nbytes() * 8


def test_codes_wider_than_six_bits_take_two_nibble_planes_and_odd_shapes_are_not_packed():
    q, s, z = codes(64, 64, 32, 2)
    q[3, 5] = 32
    assert lowbit.planes_for(q) == 4
    q[0, 0], q[1, 1] = -128, 127  # the whole int8 range
    assert torch.equal(lowbit.unpack_codes(*_nh(lowbit.pack(q, s, z, 32)), 4), q)
    assert lowbit.part_spec(q, s, None, 32).bits() == 64 * 64 * 8 + 64 * 2 * 16
    q, s, z = codes(72, 64, 32, 1)  # 72 rows: not whole 64-row blocks
    assert lowbit.pack(q, s, z, 32) is None
    q, s, z = codes(64, 64, 8, 1)   # a group of 8 columns
    assert lowbit.pack(q, s, z, 8) is None
    q, s, _ = codes(64, 64, 32, 1)
    assert lowbit.pack(q, s, torch.zeros_like(s), 32).zero is None  # an all-zero offset is not read


def _nh(p):
    return p.nibbles, p.high


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 16])
@pytest.mark.parametrize("planes,group,offsets", [(0, 32, True), (0, 16, False),
                                                  (1, 32, False), (1, 32, True), (2, 16, False),
                                                  (2, 16, True), (1, 64, True), (2, 32, True),
                                                  (4, 32, False), (4, 16, True), (4, 64, True)])
def test_the_product_equals_the_dequantized_matmul(m, planes, group, offsets):
    n, k = 192, 256
    q, s, z = codes(n, k, group, planes, offsets=offsets)
    p = lowbit.pack(q, s, z, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = lowbit.gemv(x, p.nibbles, p.high, p.scale, p.zero, group, planes)
    assert y is not None and y.shape == (m, n)
    assert close(y, want(x, q, s, z, group, planes), k)


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 7])
@pytest.mark.parametrize("planes,group", [(0, 32), (1, 32), (2, 16), (4, 32)])
def test_every_width_takes_int8_activations_only_where_switched_on(m, planes, group):
    """Each switch position gives its own formulation: the bf16 product the exact values, the
    int8-activation one (where built with AVX512-VNNI) the rounded activations' values, which
    the exact reference does not meet; and a row's result does not depend on the rows beside it."""
    n, k = 128, 192
    q, s, z = codes(n, k, group, planes, offsets=True)
    p = lowbit.pack(q, s, z, group)
    assert p.planes == planes
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    lib = lowbit.library()
    try:
        assert not lowbit.set_act8(lib, False)
        assert close(lowbit.gemv(x, p.nibbles, p.high, p.scale, p.zero, group, planes),
                     reference(x, q, s, z, group), k)
        if not lowbit.set_act8(lib, True):
            pytest.skip("no AVX512-VNNI build here: the packed codes keep the bf16 product")
        y = lowbit.gemv(x, p.nibbles, p.high, p.scale, p.zero, group, planes)
        assert close(y, act8_reference(x, q, s, z, group), k)
        assert not close(y, reference(x, q, s, z, group), k)
        for r in range(m):
            assert torch.equal(lowbit.gemv(x[r:r + 1], p.nibbles, p.high, p.scale, p.zero, group, planes),
                               y[r:r + 1])
    finally:
        lowbit.set_act8(lib)


@needs_kernel
@pytest.mark.parametrize("planes,group", [(0, 32), (1, 32), (2, 16), (4, 32)])
def test_scale_prefetch_never_changes_a_result(planes, group):
    """The scales and offsets prefetched some groups ahead (more than the layer has, too) or
    not at all: the same bits, with either activation route."""
    from vllm_edge.quant import native

    q, s, z = codes(128, 192, group, planes, offsets=True)
    p = lowbit.pack(q, s, z, group)
    x = torch.randn(3, 192, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    lib = lowbit.library()
    try:
        for act8 in (False, True):
            lowbit.set_act8(lib, act8)
            outs = []
            for ahead in (0, 1, 4, 64):
                native.set_prefetch(lib, "edge_lowbit", ahead)
                outs.append(lowbit.gemv(x, p.nibbles, p.high, p.scale, p.zero, group, planes))
            assert all(torch.equal(outs[0], o) for o in outs[1:])
    finally:
        lowbit.set_act8(lib)
        native.set_prefetch(lib, "edge_lowbit")


@needs_kernel
@pytest.mark.parametrize("planes", [0, 1, 2, 4])
def test_the_dequantizers_give_the_int8_values(planes):
    q, s, z = codes(128, 96, 16, planes)
    p = lowbit.pack(q, s, z, 16)
    want = int8.dequantize_bf16(q, s, z, 16)
    assert torch.equal(lowbit.dequantize_bf16(p.nibbles, p.high, p.scale, p.zero, 16, planes), want)
    x = torch.randn(40, 96).to(torch.bfloat16)
    y = lowbit.linear_t(x, p.nibbles, p.high, p.scale, p.zero, 16, planes)
    assert close(y, x.double() @ want.double().T, 96)
    # the prefill route's W^T holds those values exactly: an identity input reads it back
    eye = torch.eye(96, dtype=torch.bfloat16)
    assert torch.equal(lowbit.linear_t(eye, p.nibbles, p.high, p.scale, p.zero, 16, planes), want.T)


@needs_kernel
def test_a_wrong_high_bit_plane_is_caught():
    """The check can fail: one flipped plane bit moves one weight by 16 steps."""
    q, s, z = codes(64, 64, 32, 1)
    p = lowbit.pack(q, s, z, 32)
    high = p.high.clone()
    high[0, 1, 0, 1, 0] ^= 1 << 14  # row 16 + 3, column 4 + 2 of block 0 (bit 4 * 3 + 2)
    x = torch.randn(1, 64).to(torch.bfloat16)
    ref = want(x, q, s, z, 32, 1)
    assert close(lowbit.gemv(x, p.nibbles, p.high, p.scale, p.zero, 32, 1), ref, 64)
    assert not close(lowbit.gemv(x, p.nibbles, high, p.scale, p.zero, 32, 1), ref, 64)
    moved = (lowbit.unpack_codes(p.nibbles, high, 1) != q).nonzero().tolist()
    assert moved == [[19, 6]]
    # the C dequantizer reads the same bit
    assert (lowbit.dequantize_bf16(p.nibbles, high, p.scale, p.zero, 32, 1) !=
            lowbit.dequantize_bf16(p.nibbles, p.high, p.scale, p.zero, 32, 1)).nonzero().tolist() == [[19, 6]]


@needs_kernel
def test_a_wrong_high_nibble_plane_is_caught():
    """The same for 8-bit codes: one high nibble one step off moves a weight by 16 steps."""
    q, s, z = codes(64, 64, 32, 4)
    p = lowbit.pack(q, s, z, 32)
    high = p.high.clone().view(torch.uint8)
    high.view(1, 64, 32)[0, 6, 3] ^= 1  # row 3, column 6 of block 0
    high = high.view(torch.int32)
    x = torch.randn(1, 64).to(torch.bfloat16)
    ref = want(x, q, s, z, 32, 4)
    assert close(lowbit.gemv(x, p.nibbles, p.high, p.scale, p.zero, 32, 4), ref, 64)
    assert not close(lowbit.gemv(x, p.nibbles, high, p.scale, p.zero, 32, 4), ref, 64)
    assert not torch.equal(lowbit.unpack_codes(p.nibbles, high, 4), q)


@pytest.mark.parametrize("planes", [0, 1, 2, 4])
def test_rows_looked_up_from_the_packed_table_are_the_int8_rows(planes, monkeypatch):
    """The kernel's lookup and the torch route it falls back to, against cpu_int8's own."""
    q, s, z = codes(256, 96, 32, planes)
    p = lowbit.pack(q, s, z, 32)
    ids = torch.tensor([[0, 255, 64, 5], [5, 130, 191, 63]])
    want = int8.gather_rows(q, s, z, 32, ids)
    assert torch.equal(lowbit.gather(ids, p.nibbles, p.high, p.scale, p.zero, 32, planes), want)
    assert torch.equal(int8_ops.lowbit_embedding(ids, p.nibbles, p.high, p.scale, p.zero, 32, planes),
                       want.view(2, 4, 96))
    with pytest.raises(IndexError, match="token id 256 is outside the table of 256 rows"):
        lowbit.gather(torch.tensor([3, 256]), p.nibbles, p.high, p.scale, p.zero, 32, planes)
    monkeypatch.setattr(lowbit, "library", lambda: None)
    assert torch.equal(lowbit.gather(ids, p.nibbles, p.high, p.scale, p.zero, 32, planes), want)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 16, 17, 40])
def test_the_op_routes_by_rows_and_agrees(rows):
    q, s, z = codes(128, 128, 32, 2)
    p = lowbit.pack(q, s, z, 32)
    x = torch.randn(rows, 128).to(torch.bfloat16)
    bias = torch.randn(128).to(torch.bfloat16)
    out = int8_ops.lowbit_impl(x, p.nibbles, p.high, p.scale, p.zero, 32, 2)
    if rows <= int8_ops.GEMV_ROWS:
        ref = want(x, q, s, z, 32, 2)
    else:  # W^T rounded to bf16, then a bf16 GEMM
        ref = x.double() @ int8.dequantize(q, s, z, 32, torch.bfloat16).double().T
    assert close(out, ref, 128)
    assert torch.equal(int8_ops.lowbit_linear(x, p.nibbles, p.high, p.scale, p.zero, 32, 2, bias=bias),
                       out + bias)


def _layer(planes, group=32, rows=192):
    from vllm.model_executor.layers.linear import ReplicatedLinear

    from vllm_edge.quant.int8_config import CpuInt8Config

    layer = ReplicatedLinear(128, rows, bias=False, quant_config=CpuInt8Config(group),
                             prefix="model.layers.0.mlp.down_proj", params_dtype=torch.bfloat16)
    q, s, z = codes(rows, 128, group, planes, offsets=planes != 4)
    if z is None:
        z = torch.zeros_like(s)
    for name, t in (("weight_int8", q), ("weight_scale", s), ("weight_zero", z)):
        param = getattr(layer, name)
        param.weight_loader(param, t)
    layer.quant_method.process_weights_after_loading(layer)
    return layer, q, s, z


@needs_kernel
@pytest.mark.parametrize("planes", [0, 1, 2, 4])
def test_a_vllm_layer_packs_its_codes_at_load(vllm_dist, planes):
    layer, q, s, z = _layer(planes)
    assert layer.lowbit_parts == ((32, planes),) and layer.weight_int8 is None
    assert "weight_int8" not in dict(layer.named_parameters())
    assert torch.equal(lowbit.unpack_codes(layer.lowbit_nibbles.data, layer.lowbit_high.data, planes), q)
    for m in (1, 7, 40):
        x = torch.randn(m, 128).to(torch.bfloat16)
        out = layer(x)[0]
        ref = x.double() @ int8.dequantize(q, s, z, 32, torch.bfloat16).double().T
        assert close(out, ref, 128) if m > 16 else close(out, want(x, q, s, z, 32, planes), 128)


def test_a_vllm_layer_outside_whole_blocks_keeps_its_codes(vllm_dist):
    layer, q, s, z = _layer(4, rows=96)
    assert not getattr(layer, "lowbit_parts", None)
    assert torch.equal(layer.weight_int8.data, q)
    x = torch.randn(2, 128).to(torch.bfloat16)
    assert close(layer(x)[0], reference(x, q, s, z, 32), 128)


@pytest.mark.parametrize("planes", [1, 4])
def test_a_vllm_embedding_and_the_head_tied_to_it_run_from_the_packed_table(vllm_dist, planes):
    """The lookup gives the int8 rows and the tied head the int8 product, on one packed copy."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    from vllm_edge.quant.int8_config import CpuInt8Config

    cfg = CpuInt8Config(32)
    emb = VocabParallelEmbedding(256, 128, quant_config=cfg, prefix="model.embed_tokens",
                                 params_dtype=torch.bfloat16)
    q, s, z = codes(256, 128, 32, planes)
    for name, t in (("weight_int8", q), ("weight_scale", s), ("weight_zero", z)):
        param = getattr(emb, name)
        param.weight_loader(param, t)
    emb.quant_method.process_weights_after_loading(emb)
    head = ParallelLMHead(256, 128, quant_config=cfg, prefix="lm_head", params_dtype=torch.bfloat16)
    head = head.tie_weights(emb)
    head.quant_method.process_weights_after_loading(head)
    packed = lowbit.supported()
    assert bool(getattr(emb, "lowbit_parts", None)) == packed and (emb.weight_int8 is None) == packed
    ids = torch.tensor([0, 7, 255, 64])
    assert torch.equal(emb(ids), int8.gather_rows(q, s, z, 32, ids))
    x = torch.randn(3, 128).to(torch.bfloat16)
    ref = want(x, q, s, z, 32, planes) if packed else reference(x, q, s, z, 32)
    assert close(head.quant_method.apply(head, x), ref, 128)


def test_the_switch_keeps_int8(vllm_dist, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_LOWBIT", "0")
    lowbit.supported.cache_clear()
    try:
        layer, q, _, _ = _layer(1)
        assert not getattr(layer, "lowbit_parts", None) and torch.equal(layer.weight_int8.data, q)
    finally:
        monkeypatch.delenv("VLLM_EDGE_LOWBIT")
        lowbit.supported.cache_clear()


@needs_kernel
def test_the_cpp_op_gives_the_python_routes_bits():
    """vllm_edge::lowbit_linear (csrc/lowbit_op.cpp) against the Python custom op it replaces,
    at decode and prefill row counts, with and without offsets."""
    if not int8_ops.load_lowbit_op():
        pytest.skip("the C++ op did not build here: " + lowbit_op.state())
    for planes, offsets in ((1, False), (2, True), (4, True)):
        q, s, z = codes(256, 192, 32, planes, offsets=offsets)
        p = lowbit.pack(q, s, z, 32)
        for m in (1, 5, 16, 17, 40):
            x = torch.randn(2, m, 192).to(torch.bfloat16)
            got = torch.ops.vllm_edge.lowbit_linear(x, p.nibbles, p.high, p.scale, p.zero, 32, planes)
            assert got.shape == (2, m, 256)
            assert torch.equal(got, int8_ops.lowbit_impl(x, p.nibbles, p.high, p.scale, p.zero, 32, planes))


# --- a fused layer's parts -----------------------------------------------------------------

def _pairs(t):
    """[N, K/32] values stored at group 16: each repeated over two groups, as a Q4_K part of a
    layer fused with a Q6_K one is written."""
    return t.repeat_interleave(2, dim=1)


def test_scales_are_read_at_the_widest_group_over_which_they_repeat():
    q, s, z = codes(64, 128, 32, 0)
    assert lowbit.coarsest_group(_pairs(s), _pairs(z), 16) == 32
    assert lowbit.coarsest_group(_pairs(s), None, 16) == 32
    zz = _pairs(z).clone()
    zz[5, 2] += 1e-3  # one offset that does not repeat keeps the narrow group
    assert lowbit.coarsest_group(_pairs(s), zz, 16) == 16
    s4 = s[:, :2].repeat_interleave(4, dim=1)
    assert lowbit.coarsest_group(s4, None, 16) == lowbit.MAX_GROUP == 32  # not past llama.cpp's blocks
    assert lowbit.coarsest_group(s, z, 32) == 32
    spec = lowbit.part_spec(q, _pairs(s), _pairs(z), 16)
    assert (spec.group, spec.planes, spec.zero, spec.packed) == (32, 0, True, True)
    assert spec.bits() == 64 * 128 * 4 + 64 * 4 * 16 * 2


def test_the_layout_splits_a_layer_only_where_its_parts_differ_and_it_saves_a_products_cost():
    # the 1B Llama's qkv in a Q4_K_M file: Q4_K q and k, Q6_K v
    q, k = lowbit.PartSpec(2048, 2048, 32, 0, True, True), lowbit.PartSpec(512, 2048, 32, 0, True, True)
    v = lowbit.PartSpec(512, 2048, 16, 2, False, True)
    assert lowbit.layout([q, k, v]) == [q, k, v]
    assert lowbit.layout([v, v]) == [lowbit.PartSpec(1024, 2048, 16, 2, False, True)]
    # SmolLM2's: Q5_0 q and k beside Q6_K v save 83 KB, under two products' cost: one product
    small = [lowbit.PartSpec(576, 576, 32, 1, False, True), lowbit.PartSpec(192, 576, 32, 1, False, True),
             lowbit.PartSpec(192, 576, 16, 2, False, True)]
    merged = lowbit.PartSpec(960, 576, 16, 2, False, True)
    assert lowbit.layout(small) == [merged]
    assert (merged.bits() - sum(x.bits() for x in small)) // 8 < 2 * lowbit.MIN_SPLIT_BYTES
    qk, v = lowbit.PartSpec(128, 128, 32, 0, True, True), lowbit.PartSpec(64, 128, 16, 2, False, True)
    # a part that cannot be packed alone: the whole layer at its widest codes and narrowest group
    odd = lowbit.PartSpec(96, 128, 16, 1, False, False)
    assert lowbit.layout([qk, odd, v]) == [lowbit.PartSpec(288, 128, 16, 2, True, False)]
    # k and v of 32 rows each: neither alone, but the layer's 192 rows are whole blocks
    assert lowbit.layout([qk, lowbit.PartSpec(32, 128, 32, 0, True, False),
                          lowbit.PartSpec(32, 128, 16, 2, False, False)]) == [
        lowbit.PartSpec(192, 128, 16, 2, True, True)]


def _qkv_codes():
    """q (128 rows) and k (64) with 4-bit codes and offsets whose values repeat in pairs of
    16-column groups, v (64) with 6-bit codes and none: a layer of a Q4_K_M file."""
    parts = []
    for rows, planes, seed in ((128, 0, 1), (64, 0, 2), (64, 2, 3)):
        q, s, z = codes(rows, 128, 32 if planes == 0 else 16, planes, seed=seed, offsets=planes == 0)
        parts.append((q, _pairs(s) if planes == 0 else s,
                      _pairs(z) if planes == 0 else torch.zeros_like(s)))
    return parts


def test_a_fused_layers_parts_pack_apart_and_read_fewer_bytes(monkeypatch):
    monkeypatch.setattr(lowbit, "MIN_SPLIT_BYTES", 0)  # a small layer: split whatever it saves
    parts = _qkv_codes()
    q, s, z = (torch.cat(t) for t in zip(*parts))
    packed = lowbit.pack_parts(q, s, z, 16, [128, 64, 64])
    assert [(p.group, p.planes, p.zero is None) for p in packed] == [(32, 0, False), (32, 0, False), (16, 2, True)]
    for p, (pq, _, _) in zip(packed, parts):
        assert torch.equal(lowbit.unpack_codes(p.nibbles, p.high, p.planes), pq)
    whole = lowbit.pack(q, s, z, 16)
    assert whole.planes == 2
    # q and k at 4 + 1 bits, v at 6 + 1, against 6 + 2 for every row
    assert sum(p.nbytes() for p in packed) * 8 == 192 * 128 * 5 + 64 * 128 * 7 < whole.nbytes() * 8
    spec = [lowbit.part_spec(*p, 16) for p in parts]
    assert sum(x.bits() for x in lowbit.layout(spec)) == sum(p.nbytes() for p in packed) * 8
    # sizes that do not add up to the rows: the layer as one part; so too where splitting saves
    # less than the products it adds would cost
    assert len(lowbit.pack_parts(q, s, z, 16, [128, 64])) == 1
    monkeypatch.undo()
    assert [p.nbytes() for p in lowbit.pack_parts(q, s, z, 16, [128, 64, 64])] == [whole.nbytes()]


@needs_kernel
@pytest.mark.parametrize("m", [1, 3, 40])
def test_a_vllm_qkv_layer_runs_its_parts_each_at_its_width(vllm_dist, m, monkeypatch):
    """QKVParallelLinear loaded shard by shard: q and k at 4 bits and group 32, v at 6 bits and
    group 16, one product each; the output is each part's own product, and at prefill sizes
    the int8 values' matmul."""
    from vllm.model_executor.layers.linear import QKVParallelLinear

    from vllm_edge.quant.int8_config import CpuInt8Config

    monkeypatch.setattr(lowbit, "MIN_SPLIT_BYTES", 0)  # a small layer: split whatever it saves
    layer = QKVParallelLinear(128, 64, 2, 1, bias=False, quant_config=CpuInt8Config(16),
                              prefix="model.layers.0.self_attn.qkv_proj", params_dtype=torch.bfloat16)
    parts = _qkv_codes()
    for shard, (q, s, z) in zip("qkv", parts):
        for name, t in (("weight_int8", q), ("weight_scale", s), ("weight_zero", z)):
            param = getattr(layer, name)
            param.weight_loader(param, t, shard)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.lowbit_parts == ((32, 0), (32, 0), (16, 2)) and layer.weight_int8 is None
    x = torch.randn(m, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    out = layer(x)[0]
    assert out.shape == (m, 256)
    if m > int8_ops.GEMV_ROWS:
        q, s, z = (torch.cat(t) for t in zip(*parts))
        assert close(out, x.double() @ int8.dequantize(q, s, z, 16, torch.bfloat16).double().T, 128)
        return
    (q0, s0, z0), (q1, s1, z1), (q2, s2, _) = parts
    ref = torch.cat([want(x, q0, s0[:, ::2], z0[:, ::2], 32, 0), want(x, q1, s1[:, ::2], z1[:, ::2], 32, 0),
                     want(x, q2, s2, None, 16, 2)], dim=-1)
    assert close(out, ref, 128)
