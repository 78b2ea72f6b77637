"""The custom op against the dequantized reference, on every route: the packed-weight
product (native where it builds, tinygemm where not) and dequantize + GEMM.

Tolerance: max |out - ref| <= 1% of max |ref|, ref = x @ W_deq^T in fp32. Both routes
produce bf16 (relative rounding 2^-8 = 0.4%) after fp32 accumulation in a different order.
"""

from __future__ import annotations

import pytest
import torch

from support.int4_weights import packed_weights
from vllm_edge.quant import ops

ROWS = (1, 2, 8, 512)


@pytest.mark.parametrize("n,k,group", [(576, 1536, 128), (1536, 576, 128), (960, 576, 64), (112, 256, 64),
                                       (576, 1536, 32), (960, 576, 32), (112, 256, 32)])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("threshold", [ops.DEFAULT_DEQUANT_THRESHOLD, ops.NEVER, 0, ops.AUTO])
def test_gemm_matches_reference(n, k, group, rows, threshold):
    p, sz, kg, ref, _ = packed_weights(n, k, group)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    out = ops.int4_linear(x, p, sz, kg, threshold)
    expect = x.float() @ ref.t()
    assert out.shape == (rows, n) and out.dtype == torch.bfloat16
    assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("group", [128, 32])
def test_plain_copy_route_matches_reference(rows, group):
    p, sz, kg, ref, (plain, s, z) = packed_weights(576, 576, group)
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    out = ops.int4_linear(x, p, sz, kg, 4, plain, s, z, group)
    expect = x.float() @ ref.t()
    assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()


def test_bias_and_leading_dims():
    p, sz, kg, ref, _ = packed_weights(64, 128, 64)
    x = torch.randn(2, 3, 128, dtype=torch.bfloat16)
    bias = torch.randn(64, dtype=torch.bfloat16)
    out = ops.int4_linear(x, p, sz, kg, 4, bias=bias)
    expect = x.float() @ ref.t() + bias.float()
    assert out.shape == (2, 3, 64)
    assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()


def test_batch_size_is_not_a_graph_guard():
    """One dynamo graph serves 2-3 rows (tinygemm) and 9-64 rows (dequantize): the branch
    is inside the opaque op, traced through its fake impl. (Sizes 0 and 1 are always
    specialised by dynamo itself, so they are not used here.)"""
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounter

    ops.register()  # layers register at create_weights, before any tracing
    p, sz, kg, ref, _ = packed_weights(128, 128, 64)
    counter = CompileCounter()

    @torch.compile(backend=counter, dynamic=True, fullgraph=True)
    def f(x):
        return ops.int4_linear(x, p, sz, kg, 4) * 2

    dynamo.reset()
    for rows in (3, 2, 64, 9):
        x = torch.randn(rows, 128, dtype=torch.bfloat16)
        out = f(x)
        expect = 2 * (x.float() @ ref.t())
        assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()
    assert counter.frame_count == 1


def test_embedding_op_gathers_rows():
    p, sz, kg, ref, _ = packed_weights(112, 128, 64)
    ids = torch.tensor([[0, 111, 64], [65, 5, 5]])
    out = ops.int4_embedding(ids, p, sz, kg)
    assert out.shape == (2, 3, 128)
    assert (out.float() - ref[ids]).abs().max() <= ref.abs().max() * 2 ** -8


def test_auto_threshold_follows_the_kernel(monkeypatch):
    from vllm_edge.quant import native

    monkeypatch.setattr(native, "gemv_supported", lambda: False)
    assert ops.auto_threshold() == ops.DEFAULT_DEQUANT_THRESHOLD
    monkeypatch.setattr(native, "gemv_supported", lambda: True)
    assert ops.auto_threshold() == ops.NEVER


def test_auto_falls_back_per_layer(monkeypatch):
    """A layer the product refuses (N=112, a 48-row tail block) still dequantizes above 48
    rows under "auto" instead of running tinygemm at 512 rows; with a plain copy (a packing
    that differs from the measured one) the product is never asked."""
    from torch.profiler import ProfilerActivity, profile

    from vllm_edge.quant import native

    p, sz, kg, ref, plain = packed_weights(112, 256, 64)
    x = torch.randn(512, 256, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = ops.int4_linear(x, p, sz, kg, ops.AUTO)
    assert "aten::_weight_int4pack_mm_for_cpu" not in {e.key for e in prof.key_averages()}
    assert (out.float() - x.float() @ ref.t()).abs().max() <= 0.01 * (x.float() @ ref.t()).abs().max()

    asked = []
    monkeypatch.setattr(native, "gemv", lambda *a, **kw: asked.append(a) or None)
    p, sz, kg, ref, plain = packed_weights(128, 256, 64)
    for rows in (1, 512):
        x = torch.randn(rows, 256, dtype=torch.bfloat16)
        out = ops.int4_linear(x, p, sz, kg, ops.AUTO, *plain, 64)
        assert (out.float() - x.float() @ ref.t()).abs().max() <= 0.01 * (x.float() @ ref.t()).abs().max()
    assert asked == []
