"""The native kernels (quant/csrc/) against the torch reference.

The dequantizer (int4_dequant.c) must be bit-identical to ``pack.dequantize_packed``: same
fp32 arithmetic, same round-to-nearest-even to bf16. Shapes cover full 64-row blocks, tails
of 16/32/48 rows, K=576 (SmolLM2, run as groups of 64) and chunked row ranges.

The products (int4_gemv.c, and int4_gemv32.c for torch's 32-row packing) accumulate in a
different order than any reference, so each output is checked against the fp32 product of
the dequantized weight within bf16 output rounding plus fp32 accumulation slack.
"""

from __future__ import annotations

import pytest
import torch

from support.int4_weights import packed_weights
from vllm_edge.quant import native, ops, pack


@pytest.fixture(scope="module")
def lib():
    from vllm_edge.quant import pack

    if pack.block_n() != native.BLOCK_N:
        pytest.skip(f"torch packs blocks of {pack.block_n()} rows on this CPU; the native kernels "
                    "read blocks of 64 and are not used here (test_ops covers the torch route)")
    lib = native.library()
    if lib is None:
        pytest.fail("the native dequantizer did not build here (a C compiler is installed on this host)")
    return lib


@pytest.mark.parametrize("n,k,group", [(576, 576, 128), (1536, 576, 64), (112, 256, 64), (64, 32, 32),
                                       (176, 512, 128), (144, 1024, 256), (1536, 576, 32), (176, 576, 32)])
@pytest.mark.parametrize("threads", [1, 2])
def test_bit_identical_to_reference(lib, n, k, group, threads):
    p, sz, kg = packed_weights(n, k, group)[:3]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = native.dequantize(p, sz, kg)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(w, pack.dequantize_packed(p, sz, kg).contiguous())


def test_row_ranges(lib):
    p, sz, kg = packed_weights(176, 256, 64)[:3]  # two full blocks and a 48-row tail
    ref = pack.dequantize_packed(p, sz, kg)
    out = torch.full((176, 256), float("nan"), dtype=torch.bfloat16)
    for r0, r1 in ((0, 64), (64, 128), (128, 176)):
        native.dequantize(p, sz, kg, r0, r1, out=out[r0:])
    assert torch.equal(out, ref)
    assert native.dequantize(p, sz, kg, 32, 64) is None  # not block-aligned: refused, not wrong


@pytest.mark.parametrize("workspace_mb", [1, 64])
def test_chunked_linear_matches_reference(lib, workspace_mb):
    """1 MB holds 256 rows of K=2048, so 1000 output rows run in four chunks."""
    p, sz, kg = packed_weights(1008, 2048, 64)[:3]
    x = torch.randn(100, 2048, dtype=torch.bfloat16)
    out = ops.int4_linear(x, p, sz, kg, 4, workspace_mb=workspace_mb)
    expect = x.float() @ pack.dequantize_packed(p, sz, kg).float().t()
    assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()
    assert 0 < native.workspace_bytes() <= max(workspace_mb << 20, 1008 * 2048 * 2)


def test_multi_row_route_runs_the_native_kernel(lib):
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = packed_weights(256, 512, 64)[:3]
    x = torch.randn(512, 512, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ops.int4_linear(x, p, sz, kg, ops.DEFAULT_DEQUANT_THRESHOLD)
    names = {e.key for e in prof.key_averages()}
    assert "edge_int4_dequant" in names and "aten::addcmul" not in names


def test_without_the_kernel_the_torch_route_is_still_correct(monkeypatch):
    monkeypatch.setattr(native, "library", lambda: None)
    p, sz, kg = packed_weights(112, 256, 64)[:3]
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    out = ops.int4_linear(x, p, sz, kg, 4)
    expect = x.float() @ pack.dequantize_packed(p, sz, kg).float().t()
    assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()


_PROBE = """
import json, torch
from vllm_edge.quant import native
ok = native.openmp()
files = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libgomp" in l.rsplit("/", 1)[-1]})
print(json.dumps({"openmp": ok, "files": files, "torch_dir": torch.__file__.rsplit("/", 1)[0]}))
"""


def test_team_route_runs_on_torchs_openmp_runtime(lib):
    """Built with -fopenmp, and the library's libgomp.so.1 is the one torch loaded: one
    runtime in the process, so the dequantization runs on torch's own thread team. Checked in
    a fresh interpreter: other tests (llama.cpp) load runtimes of their own into this one."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["openmp"], "gcc with -fopenmp is installed here: the OpenMP build should load"
    assert len(got["files"]) == 1 and got["torch_dir"] in got["files"][0], got


@pytest.mark.parametrize("n,k,group", [(1536, 576, 64), (176, 512, 128), (576, 576, 128), (112, 256, 64)])
def test_team_route_bit_identical(lib, monkeypatch, n, k, group):
    """VLLM_EDGE_INT4_OPENMP=1: the rows split over the OpenMP team, tails included."""
    monkeypatch.setenv("VLLM_EDGE_INT4_OPENMP", "1")
    native.team_route.cache_clear()
    try:
        assert native.team_route()
        p, sz, kg = packed_weights(n, k, group)[:3]
        old = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            w = native.dequantize(p, sz, kg)
            ref = pack.dequantize_packed(p, sz, kg).contiguous()
            out = torch.full((n, k), float("nan"), dtype=torch.bfloat16)
            for r0 in range(0, n, 128):  # row ranges through the team too
                native.dequantize(p, sz, kg, r0, min(n, r0 + 128), out=out[r0:])
        finally:
            torch.set_num_threads(old)
        assert torch.equal(w, ref) and torch.equal(out, ref)
    finally:
        native.team_route.cache_clear()


def test_team_route_is_off_by_default(lib, monkeypatch):
    monkeypatch.delenv("VLLM_EDGE_INT4_OPENMP", raising=False)
    native.team_route.cache_clear()
    try:
        assert native.team_route() is False
    finally:
        native.team_route.cache_clear()


@pytest.mark.parametrize("n,k,group", [(1536, 576, 64), (176, 512, 128)])
def test_python_thread_route_still_bit_identical(lib, monkeypatch, n, k, group):
    """The default route (and the one for builds without OpenMP)."""
    monkeypatch.setattr(native, "team_route", lambda: False)
    p, sz, kg = packed_weights(n, k, group)[:3]
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w = native.dequantize(p, sz, kg)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(w, pack.dequantize_packed(p, sz, kg).contiguous())


@pytest.mark.parametrize("n,k,group", [(576, 576, 64), (176, 512, 128), (112, 256, 64), (64, 32, 32)])
def test_gather_rows_bit_identical(lib, n, k, group):
    p, sz, kg = packed_weights(n, k, group)[:3]
    # rows from both nibble halves of full blocks, the tail (if any), repeats, the last row
    ids = torch.tensor([[0, 31, 32, 63, n - 1], [n // 2, 1, 1, n - 2, 33]])
    got = native.gather_rows(p, sz, kg, ids)
    ref = pack.gather_rows_packed(p, sz, kg, ids, dtype=torch.bfloat16)
    assert got.shape == (10, k)
    assert torch.equal(got, ref)
    assert torch.equal(got, pack.dequantize_packed(p, sz, kg)[ids.reshape(-1)])
    assert torch.equal(native.gather_rows(p, sz, kg, ids.to(torch.int32)), ref)
    assert native.gather_rows(p, sz, kg, torch.tensor([], dtype=torch.long)).shape == (0, k)


def test_gather_rows_refuses_ids_outside_the_table(lib):
    p, sz, kg = packed_weights(112, 256, 64)[:3]
    with pytest.raises(IndexError, match="token id 112 is outside the table of 112 rows"):
        native.gather_rows(p, sz, kg, torch.tensor([3, 112]))
    with pytest.raises(IndexError, match="token id -1"):
        native.gather_rows(p, sz, kg, torch.tensor([-1, 3]))


def test_embedding_op_uses_the_native_gather(lib):
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = packed_weights(176, 512, 64)[:3]
    ids = torch.randint(0, 176, (4, 33))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = ops.int4_embedding(ids, p, sz, kg)
    assert out.shape == (4, 33, 512)
    assert torch.equal(out.reshape(-1, 512), pack.dequantize_packed(p, sz, kg)[ids.reshape(-1)])
    names = {e.key for e in prof.key_averages()}
    # the torch gather's own ops (index arithmetic on the ids) are gone
    assert "aten::remainder" not in names and "aten::repeat_interleave" not in names


# --- the few-row product (csrc/int4_gemv.c) -------------------------------------------

@pytest.fixture(scope="module")
def gemv_lib(lib):
    if not {"avx512_bf16", "avx512vbmi"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU lacks AVX512-BF16 or VBMI: small batches run on tinygemm (tested in test_ops)")
    assert native.gemv_supported(), "AVX512-BF16 and gcc -fopenmp are here: the product should build"
    return lib


def _bound(x, w):
    """bf16 output rounding (2^-8 relative) plus fp32 accumulation slack. ``w`` must be the
    fp32 dequantization: the kernel never rounds weights to bf16."""
    ref = x.float() @ w.float().t()
    return ref, 2 ** -8 * ref.abs() + 1e-5 * (x.float().abs() @ w.float().abs().t()) + 1e-6


def _gemv_on(threads, x, p, sz, kg):
    """native.gemv with torch set to ``threads`` threads for the call."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return native.gemv(x, p, sz, kg)
    finally:
        torch.set_num_threads(old)


def act8_reference(x, p, sz, kg):
    """The int8-activation product: each row of x rounded per group as the kernel's rule says
    (step max|x| / 127 in fp32, nearest, ties to even), exact integer dots with the codes."""
    k = x.shape[1]
    q = pack.unpack_packed(p, k).double() - 8
    s, z = sz[..., 0].T.double(), sz[..., 1].T.double()
    xf = x.float().view(x.shape[0], -1, kg)
    step = xf.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    xq = torch.round(xf * inv).clamp(-127, 127).double()
    dots = torch.einsum("mgk,ngk->mng", xq, q.view(q.shape[0], -1, kg))
    return ((dots * s[None] * step.double().squeeze(-1)[:, None, :]).sum(-1)
            + (z[None] * xf.double().sum(-1)[:, None, :]).sum(-1)).float()


def act8_on():
    lib = native.library()
    return bool(native.gemv_supported() and lib.edge_int4_act8())


def _check_against_reference(n, k, group, rows, threads):
    """Whichever product native.gemv runs here, against the fp32 product of the dequantized
    weight, or where the product rounds activations to int8, against that formulation."""
    p, sz, kg = packed_weights(n, k, group)[:3]
    w = pack.dequantize_packed(p, sz, kg, dtype=torch.float32)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    y = _gemv_on(threads, x, p, sz, kg)
    ref, tol = _bound(x, w)
    if act8_on():
        ref = act8_reference(x, p, sz, kg)
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    assert ((y.float() - ref).abs() <= tol).all(), (y.float() - ref).abs().max()


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_int8_activations_only_where_switched_on(gemv_lib, rows):
    """Each switch position gives its own formulation: the bf16 product the dequantized
    weight's, the int8-activation one (where built with AVX512-VNNI) the rounded activations',
    which the exact bound does not hold; a row's result does not depend on the rows beside it."""
    p, sz, kg = packed_weights(960, 576, 32)[:3]
    w = pack.dequantize_packed(p, sz, kg, dtype=torch.float32)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref, tol = _bound(x, w)
    try:
        assert not native.set_act8(gemv_lib, False)
        assert ((native.gemv(x, p, sz, kg).float() - ref).abs() <= tol).all()
        if not native.set_act8(gemv_lib, True):
            pytest.skip("no AVX512-VNNI build here: the product keeps bf16 activations")
        y = native.gemv(x, p, sz, kg)
        assert ((y.float() - act8_reference(x, p, sz, kg)).abs() <= tol).all()
        assert not ((y.float() - ref).abs() <= tol).all()
        for r in range(rows):
            assert torch.equal(native.gemv(x[r:r + 1], p, sz, kg), y[r:r + 1])
    finally:
        native.set_act8(gemv_lib)


@pytest.mark.parametrize("n,k,group", [(960, 576, 32), (1536, 576, 64), (576, 1536, 128), (64, 2048, 64),
                                       (128, 512, 256)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 512])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemv_matches_reference(gemv_lib, n, k, group, rows, threads):
    _check_against_reference(n, k, group, rows, threads)


def test_gemv_refuses_shapes_it_cannot_take(gemv_lib):
    p, sz, kg = packed_weights(112, 256, 64)[:3]  # a 48-row tail block
    assert native.gemv(torch.randn(1, 256, dtype=torch.bfloat16), p, sz, kg) is None
    p, sz, kg = packed_weights(128, 256, 64)[:3]
    assert native.gemv(torch.randn(1, 256), p, sz, kg) is None  # fp32 activations
    assert native.gemv(torch.randn(1, 256, dtype=torch.bfloat16), p, sz, kg) is not None


def test_small_batches_run_the_native_product(gemv_lib):
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = packed_weights(256, 512, 64)[:3]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for rows in (1, 8, ops.DEFAULT_DEQUANT_THRESHOLD):
            ops.int4_linear(torch.randn(rows, 512, dtype=torch.bfloat16), p, sz, kg, ops.DEFAULT_DEQUANT_THRESHOLD)
    names = {e.key for e in prof.key_averages()}
    assert "aten::_weight_int4pack_mm_for_cpu" not in names and "edge_int4_dequant" not in names


def test_without_the_product_small_batches_use_tinygemm(monkeypatch):
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(native, "gemv_supported", lambda: False)
    monkeypatch.setattr(native, "gemv32_supported", lambda: False)
    p, sz, kg = packed_weights(256, 512, 64)[:3]
    x = torch.randn(2, 512, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = ops.int4_linear(x, p, sz, kg, ops.DEFAULT_DEQUANT_THRESHOLD)
    assert "aten::_weight_int4pack_mm_for_cpu" in {e.key for e in prof.key_averages()}
    ref, tol = _bound(x, pack.dequantize_packed(p, sz, kg, dtype=torch.float32))
    assert ((out.float() - ref).abs() <= tol).all()


def test_gemv_switch_off_means_tinygemm(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_INT4_GEMV", "0")
    native.gemv_supported.cache_clear()
    native.gemv32_supported.cache_clear()
    try:
        assert native.gemv_supported() is False and native.gemv32_supported() is False
        assert ops.auto_threshold() == ops.DEFAULT_DEQUANT_THRESHOLD
        p, sz, kg = packed_weights(128, 256, 64)[:3]
        assert native.gemv(torch.randn(1, 256, dtype=torch.bfloat16), p, sz, kg) is None
    finally:
        native.gemv_supported.cache_clear()
        native.gemv32_supported.cache_clear()


# --- the 32-row-block product (csrc/int4_gemv32.c), where torch packs 32-row blocks ----------

@pytest.fixture(scope="module")
def gemv32_lib():
    if pack.block_n() != 32:
        pytest.skip(f"torch packs blocks of {pack.block_n()} rows on this CPU; the 32-row product is not used here")
    if not {"avx2", "fma"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU lacks AVX2 or FMA: small batches run on tinygemm")
    assert native.gemv32_supported(), "AVX2, FMA and gcc -fopenmp are here: the 32-row product should build"
    return native.library32()


@pytest.mark.parametrize("n,k,group", [(960, 576, 32), (1536, 576, 64), (576, 1536, 128), (64, 2048, 64),
                                       (128, 512, 256), (32, 64, 32)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 48])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemv32_matches_reference(gemv32_lib, n, k, group, rows, threads):
    _check_against_reference(n, k, group, rows, threads)


@pytest.mark.parametrize("group", [32, 64])
def test_gemv32_row_does_not_depend_on_its_batch(gemv32_lib, group):
    """A row gives the same bits alone (the one-row path) as in a batch (the tiled path) and
    on one thread as on two: speculative verification then scores a token exactly as plain
    decode does."""
    p, sz, kg = packed_weights(192, 576, group)[:3]
    # a wrong row, offset or thread split shows here; a change in the fp32 summation order
    # mostly hides under the bf16 output rounding (tried: one output in ~10^4 moved), so the
    # same order on both paths is kept by construction in the kernel
    x = torch.randn(7, 576, dtype=torch.bfloat16)
    batch = native.gemv(x, p, sz, kg)
    one_thread = _gemv_on(1, x, p, sz, kg)
    assert torch.equal(batch.view(torch.int16), one_thread.view(torch.int16))
    for i in range(7):
        alone = native.gemv(x[i:i + 1], p, sz, kg)
        assert torch.equal(alone.view(torch.int16), batch[i:i + 1].view(torch.int16)), i


def test_gemv32_refuses_what_it_cannot_take(gemv32_lib):
    p, sz, kg = packed_weights(112, 256, 64)[:3]  # 3 blocks of 32 and a 16-row tail
    assert native.gemv(torch.randn(1, 256, dtype=torch.bfloat16), p, sz, kg) is None
    p, sz, kg = packed_weights(128, 256, 64)[:3]
    assert native.gemv(torch.randn(1, 256), p, sz, kg) is None  # fp32 activations
    x = torch.randn(9, 256, dtype=torch.bfloat16)
    assert native.gemv(x, p, sz, kg, max_rows=8) is None  # above the caller's threshold
    assert native.gemv(x, p, sz, kg, max_rows=9) is not None


def test_gemv32_runs_batches_up_to_the_threshold(gemv32_lib):
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = packed_weights(256, 512, 64)[:3]
    t = ops.DEFAULT_DEQUANT_THRESHOLD
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for rows in (1, 8, t):
            ops.int4_linear(torch.randn(rows, 512, dtype=torch.bfloat16), p, sz, kg, ops.AUTO)
    names = {e.key for e in prof.key_averages()}
    assert "edge_int4_product" in names and "aten::_weight_int4pack_mm_for_cpu" not in names
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x = torch.randn(t + 1, 512, dtype=torch.bfloat16)
        out = ops.int4_linear(x, p, sz, kg, ops.AUTO)
    assert "edge_int4_product" not in {e.key for e in prof.key_averages()}  # dequantize + GEMM
    ref, tol = _bound(x, pack.dequantize_packed(p, sz, kg, dtype=torch.float32))
    assert ((out.float() - ref).abs() <= tol).all()


def test_profiler_ranges_only_while_a_profiler_runs(lib, monkeypatch):
    """record_function dispatches profiler ops even with no profiler on: not on the hot path."""
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = packed_weights(256, 512, 64)[:3]
    x = torch.randn(64, 512, dtype=torch.bfloat16)
    real = torch.profiler.record_function
    monkeypatch.setattr(torch.profiler, "record_function",
                        lambda name: pytest.fail(f"range {name} opened with no profiler running"))
    native.gemv(x[:2], p, sz, kg)
    native.linear(x, p, sz, kg, 32 << 20)
    monkeypatch.setattr(torch.profiler, "record_function", real)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        native.linear(x, p, sz, kg, 32 << 20)
        product = native.gemv(x[:2], p, sz, kg) is not None
    names = {e.key for e in prof.key_averages()}
    assert "edge_int4_dequant" in names and ("edge_int4_product" in names) == product


def test_an_unwritable_kernel_cache_falls_back_instead_of_failing(tmp_path, monkeypatch):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("VLLM_EDGE_HOME", str(blocker))
    native.library.cache_clear()
    try:
        assert native.library() is None
    finally:
        native.library.cache_clear()


@pytest.mark.parametrize("n,k,group", [(960, 576, 32), (128, 64, 32), (576, 1536, 128)])
def test_scale_prefetch_never_changes_a_result(gemv_lib, monkeypatch, n, k, group):
    """The scales prefetched some groups ahead (more than a layer has, too) or not at all: the
    same bits, with either activation route."""
    p, sz, kg = packed_weights(n, k, group)[:3]
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    try:
        for act8 in (False, True):
            native.set_act8(gemv_lib, act8)
            outs = []
            for ahead in (0, 1, 4, 64):
                assert native.set_prefetch(gemv_lib, "edge_int4", ahead) == ahead
                outs.append(native.gemv(x, p, sz, kg))
            assert all(torch.equal(outs[0], o) for o in outs[1:])
        monkeypatch.setenv("VLLM_EDGE_SCALE_PREFETCH", "0")
        assert native.set_prefetch(gemv_lib, "edge_int4") == 0
    finally:
        native.set_act8(gemv_lib)
        monkeypatch.delenv("VLLM_EDGE_SCALE_PREFETCH")
        native.set_prefetch(gemv_lib, "edge_int4")
