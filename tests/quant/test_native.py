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
