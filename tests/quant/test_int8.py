"""cpu_int8's kernels against the torch formulation they must equal: the product at every row
count and group, with and without offsets, on each ISA path the C source has."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.quant import int8, int8_ops, native


def weights(n, k, group, seed=0, offsets=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int16).to(torch.int8)
    s = (torch.rand(n, k // group, generator=g) * 1e-3 + 1e-4).to(torch.float16)
    z = ((torch.rand(n, k // group, generator=g) - 0.5) * 1e-2).to(torch.float16) if offsets else None
    return q, s, z


def reference(x, q, s, z, group):
    zz = torch.zeros_like(s) if z is None else z
    return x.double() @ int8.dequantize(q, s, zz, group).double().T


def close(y, ref, k):
    # bf16 output rounding (2^-8 relative) plus fp32 accumulation over k terms
    bound = ref.abs() * 2 ** -8 + (ref.abs().max() + 1e-3) * k * 2 ** -22
    return bool(((y.double() - ref).abs() <= bound).all())


@pytest.mark.parametrize("m", [1, 2, 8, 9, 16])
@pytest.mark.parametrize("group", [16, 32, 64])
@pytest.mark.parametrize("offsets", [True, False])
def test_the_product_equals_the_dequantized_matmul(m, group, offsets):
    n, k = 72, 448  # k: seven 64-column steps, the decode loop's tail included
    q, s, z = weights(n, k, group, offsets=offsets)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = int8.gemv(x, q, s, z, group)
    assert y is not None and y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert close(y, reference(x, q, s, z, group), k)


def test_a_wrong_scale_index_is_caught():
    """The check above can fail: the same codes read with the scales of the next row differ."""
    q, s, z = weights(8, 64, 32)
    x = torch.randn(1, 64).to(torch.bfloat16)
    y = int8.gemv(x, q, s.roll(1, dims=0).contiguous(), z, 32)
    assert not close(y, reference(x, q, s, z, 32), 64)


def test_dequantize_and_gather_equal_the_torch_formulation():
    q, s, z = weights(40, 96, 32)
    want = int8.dequantize(q, s, z, 32, torch.bfloat16)
    got = int8.dequantize_bf16(q, s, z, 32)
    # the C may fuse the multiply-add (one rounding fewer): at most one bf16 step apart
    assert torch.allclose(got.float(), want.float(), rtol=2 ** -7, atol=0)
    ids = torch.tensor([[0, 39], [7, 7]])
    rows = int8.gather_rows(q, s, z, 32, ids)
    assert torch.equal(rows, got[ids.reshape(-1)])
    with pytest.raises(IndexError, match="token id 40 is outside the table of 40 rows"):
        int8.gather_rows(q, s, z, 32, torch.tensor([40]))


def test_quantize_keeps_every_weight_within_half_a_step():
    w = torch.randn(16, 128) * 0.05
    q, s, z = int8.quantize(w, 32)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= int8.QMAX and not z.any()
    err = (int8.dequantize(q, s, z, 32) - w).abs()
    assert bool((err <= int8.expand(s.float(), 32, 128) * 0.5 + 1e-7).all())
    with pytest.raises(ValueError, match="input size 100 is not a multiple of the group 32"):
        int8.quantize(torch.randn(2, 100), 32)


@pytest.mark.parametrize("rows", [1, 16, 17, 40])
def test_the_linear_op_routes_by_rows_and_agrees(rows):
    q, s, z = weights(64, 128, 32)
    x = torch.randn(rows, 128).to(torch.bfloat16)
    bias = torch.randn(64).to(torch.bfloat16)
    out = int8_ops.linear_impl(x, q, s, z, 32)
    if rows <= int8_ops.GEMV_ROWS:
        ref = reference(x, q, s, z, 32)
    else:  # dequantized to bf16 once, then a bf16 GEMM: the weights are rounded too
        ref = x.double() @ int8.dequantize(q, s, z, 32, torch.bfloat16).double().T
    assert close(out, ref, 128)
    assert torch.equal(int8_ops.linear(x, q, s, z, 32, bias=bias), out + bias)


@pytest.mark.parametrize("flags", [["-O3"], ["-O3", "-mavx2", "-mfma", "-mf16c"]],
                         ids=["portable", "avx2"])
def test_the_other_isa_paths_agree(flags, tmp_path, monkeypatch):
    """The same source built without AVX-512 (the AVX2 loop) and for no vector ISA at all
    (the portable loop, and the software fp16 conversion) gives the same products."""
    import ctypes

    if "-mavx2" in flags and "avx2" not in native._cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    lib, errors = native.build_and_load("int8-test", int8.SOURCES, [flags])
    assert lib is not None, errors
    lib.edge_int8_gemv.restype = ctypes.c_int
    lib.edge_int8_gemv.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5
    for m, group in ((1, 32), (3, 16), (2, 64)):
        q, s, z = weights(24, 192, group)
        x = torch.randn(m, 192).to(torch.bfloat16)
        y = torch.empty(m, 24, dtype=torch.bfloat16)
        assert lib.edge_int8_gemv(q.data_ptr(), s.data_ptr(), z.data_ptr(), x.data_ptr(), y.data_ptr(),
                                  m, 24, 192, group, 1) == 0
        assert close(y, reference(x, q, s, z, group), 192), (flags, m, group)


@pytest.mark.parametrize("group", [32, 64])
def test_on_the_avx2_path_a_row_does_not_depend_on_its_batch(group, tmp_path, monkeypatch):
    """The AVX2 loop gives a row the same bits alone (decode) as among others (a batch, or
    speculative verification), on one thread or two."""
    import ctypes

    if not {"avx2", "fma", "f16c"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU has no AVX2/FMA/F16C")
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    lib, errors = native.build_and_load("int8-test", int8.SOURCES, [["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]])
    assert lib is not None, errors
    lib.edge_int8_gemv.restype = ctypes.c_int
    lib.edge_int8_gemv.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5
    n, k = 40, 576
    q, s, z = weights(n, k, group)
    x = torch.randn(7, k).to(torch.bfloat16)

    def run(rows, threads):
        y = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)
        assert lib.edge_int8_gemv(q.data_ptr(), s.data_ptr(), z.data_ptr(), rows.data_ptr(), y.data_ptr(),
                                  rows.shape[0], n, k, group, threads) == 0
        return y.view(torch.int16)

    batch = run(x, 2)
    assert close(batch.view(torch.bfloat16), reference(x, q, s, z, group), k)
    assert torch.equal(run(x, 1), batch)
    for i in range(7):
        assert torch.equal(run(x[i:i + 1].contiguous(), 2), batch[i:i + 1]), i
