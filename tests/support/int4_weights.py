"""Random cpu_int4 weights packed as the kernels take them (the quantizer's own steps)."""

from __future__ import annotations

import torch

from vllm_edge.quant import pack


def packed_weights(n: int, k: int, group: int):
    """A random [n, k] weight quantized at ``group``: (packed, scales_and_zeros, kernel_group,
    fp32 reference, (plain packed, scales, zeros)); packed is repacked for the kernels."""
    w = torch.randn(n, k) * 0.05
    q, s, z = pack.quantize(w, group)
    p = pack.pack_nibbles(q)
    ref = pack.dequantize_plain(p, s, z, group)
    kg = pack.kernel_group(k, group)
    sz = pack.scales_and_zeros(s, z, group, k, kg)
    plain = p.clone()
    pack.repack_(p)
    return p, sz, kg, ref, (plain, s, z)
