"""The dequantize-then-GEMM dtype: float32 only for bf16 activations on a CPU without a bf16
GEMM kernel, and the int4 route that uses it agrees with the bf16 one."""

from __future__ import annotations

import torch

from vllm_edge.quant import gemm, ops, pack


def test_float32_only_for_bf16_without_a_fast_kernel(monkeypatch):
    monkeypatch.setattr(gemm, "bf16_is_fast", lambda: False)
    assert gemm.compute_dtype(torch.bfloat16) == torch.float32
    assert gemm.compute_dtype(torch.float32) == torch.float32
    assert gemm.compute_dtype(torch.float16) == torch.float16
    monkeypatch.setattr(gemm, "bf16_is_fast", lambda: True)
    assert gemm.compute_dtype(torch.bfloat16) == torch.bfloat16


def test_the_float32_route_matches_the_weights(monkeypatch):
    torch.manual_seed(0)
    n, k, group = 96, 128, 32
    w = torch.randn(n, k)
    q, scale, zero = pack.quantize(w, group)[:3]
    packed = pack.pack_nibbles(q) if q.shape[1] == k else q
    ref = pack.dequantize_plain(packed, scale, zero, group, dtype=torch.float32)
    sz = pack.scales_and_zeros(scale, zero, group, k, group)
    tiny = packed.clone()
    pack.repack_(tiny)
    x = torch.randn(40, k, dtype=torch.bfloat16)
    expect = x.float() @ ref.t()
    for fast in (False, True):
        monkeypatch.setattr(gemm, "bf16_is_fast", lambda fast=fast: fast)
        out = ops.int4_linear_impl(x, tiny, sz, group, 0)  # 40 rows over a threshold of 0: dequantize
        assert out.dtype == torch.bfloat16
        assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()
