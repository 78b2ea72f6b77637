"""The native dequantizer (quant/csrc/int4_dequant.c) against the torch reference.

It must be bit-identical to ``pack.dequantize_packed``: same fp32 arithmetic, same
round-to-nearest-even to bf16. Shapes cover full 64-row blocks, tails of 16/32/48 rows,
K=576 (SmolLM2, run as groups of 64) and chunked row ranges.
"""

from __future__ import annotations

import pytest
import torch

from vllm_edge.quant import native, ops, pack


def _packed(n, k, group):
    w = torch.randn(n, k) * 0.05
    q, s, z = pack.quantize(w, group)
    p = pack.pack_nibbles(q)
    kg = pack.kernel_group(k, group)
    sz = pack.scales_and_zeros(s, z, group, k, kg)
    pack.repack_(p)
    return p, sz, kg


@pytest.fixture(scope="module")
def lib():
    lib = native.library()
    if lib is None:
        pytest.fail("the native dequantizer did not build here (a C compiler is installed on this host)")
    return lib


@pytest.mark.parametrize("n,k,group", [(576, 576, 128), (1536, 576, 64), (112, 256, 64), (64, 32, 32),
                                       (176, 512, 128), (144, 1024, 256), (1536, 576, 32), (176, 576, 32)])
@pytest.mark.parametrize("threads", [1, 2])
def test_bit_identical_to_reference(lib, n, k, group, threads):
    p, sz, kg = _packed(n, k, group)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = native.dequantize(p, sz, kg)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(w, pack.dequantize_packed(p, sz, kg).contiguous())


def test_row_ranges(lib):
    p, sz, kg = _packed(176, 256, 64)  # two full blocks and a 48-row tail
    ref = pack.dequantize_packed(p, sz, kg)
    out = torch.full((176, 256), float("nan"), dtype=torch.bfloat16)
    for r0, r1 in ((0, 64), (64, 128), (128, 176)):
        native.dequantize(p, sz, kg, r0, r1, out=out[r0:])
    assert torch.equal(out, ref)
    assert native.dequantize(p, sz, kg, 32, 64) is None  # not block-aligned: refused, not wrong


@pytest.mark.parametrize("workspace_mb", [1, 64])
def test_chunked_linear_matches_reference(lib, workspace_mb):
    """1 MB holds 256 rows of K=2048, so 1000 output rows run in four chunks."""
    p, sz, kg = _packed(1008, 2048, 64)
    x = torch.randn(100, 2048, dtype=torch.bfloat16)
    out = ops.int4_linear(x, p, sz, kg, 4, workspace_mb=workspace_mb)
    expect = x.float() @ pack.dequantize_packed(p, sz, kg).float().t()
    assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()
    assert 0 < native.workspace_bytes() <= max(workspace_mb << 20, 1008 * 2048 * 2)


def test_multi_row_route_runs_the_native_kernel(lib):
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = _packed(256, 512, 64)
    x = torch.randn(512, 512, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ops.int4_linear(x, p, sz, kg, ops.DEFAULT_DEQUANT_THRESHOLD)
    names = {e.key for e in prof.key_averages()}
    assert "edge_int4_dequant" in names and "aten::addcmul" not in names


def test_without_the_kernel_the_torch_route_is_still_correct(monkeypatch):
    monkeypatch.setattr(native, "library", lambda: None)
    p, sz, kg = _packed(112, 256, 64)
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
        p, sz, kg = _packed(n, k, group)
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
    p, sz, kg = _packed(n, k, group)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w = native.dequantize(p, sz, kg)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(w, pack.dequantize_packed(p, sz, kg).contiguous())


@pytest.mark.parametrize("n,k,group", [(576, 576, 64), (176, 512, 128), (112, 256, 64), (64, 32, 32)])
def test_gather_rows_bit_identical(lib, n, k, group):
    p, sz, kg = _packed(n, k, group)
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
    p, sz, kg = _packed(112, 256, 64)
    with pytest.raises(IndexError, match="token id 112 is outside the table of 112 rows"):
        native.gather_rows(p, sz, kg, torch.tensor([3, 112]))
    with pytest.raises(IndexError, match="token id -1"):
        native.gather_rows(p, sz, kg, torch.tensor([-1, 3]))


def test_embedding_op_uses_the_native_gather(lib):
    from torch.profiler import ProfilerActivity, profile

    p, sz, kg = _packed(176, 512, 64)
    ids = torch.randint(0, 176, (4, 33))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = ops.int4_embedding(ids, p, sz, kg)
    assert out.shape == (4, 33, 512)
    assert torch.equal(out.reshape(-1, 512), pack.dequantize_packed(p, sz, kg)[ids.reshape(-1)])
    names = {e.key for e in prof.key_averages()}
    # the torch gather's own ops (index arithmetic on the ids) are gone
    assert "aten::remainder" not in names and "aten::repeat_interleave" not in names
