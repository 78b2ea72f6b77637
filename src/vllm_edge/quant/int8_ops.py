"""The ``cpu_int8`` linear and embedding as vLLM custom ops.

Batches up to :data:`GEMV_ROWS` rows run the native product straight from the codes (each
weight row read once per 8 activation rows); larger ones dequantize the layer to bf16 once
and run a bf16 GEMM, which pays the widening once instead of once per 8 rows. The choice
depends on the row count, so it is made inside an opaque op: dynamo never specialises or
guards on the batch size. The fake impls only compute shapes.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch

from vllm_edge.quant import gemm, int8, lowbit, lowbit_op

OP_NAME = "edge_cpu_int8_linear"
LOWBIT_OP_NAME = "edge_cpu_int8_lowbit_linear"
EMBED_OP_NAME = "edge_cpu_int8_embedding"
LOWBIT_EMBED_OP_NAME = "edge_cpu_int8_lowbit_embedding"
# Above this many rows a dequantize + bf16 GEMM reads the weight once; below, the product
# reads it ceil(rows / 8) times but skips the bf16 copy (decode, and speculative verify).
GEMV_ROWS = 16

_lock = threading.Lock()
_registered = False
_native_lowbit = False  # set at load (load_lowbit_op): a plain bool, so dynamo specialises on it


def linear_impl(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: Optional[torch.Tensor],
                group: int) -> torch.Tensor:
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    out = None
    if x2.shape[0] <= GEMV_ROWS and x.dtype == torch.bfloat16:
        out = int8.gemv(x2, q, scale, zero, group)
    if out is None:
        w = int8.dequantize_bf16(q, scale, zero, group)
        ct = gemm.compute_dtype(x.dtype)  # float32 where torch has no fast bf16 GEMM
        out = torch.nn.functional.linear(x2.to(ct), w.to(ct)).to(x.dtype)
    return out.view(*x.shape[:-1], q.shape[0])


def _linear_fake(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: Optional[torch.Tensor],
                 group: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def lowbit_impl(x: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
                zero: Optional[torch.Tensor], group: int, planes: int) -> torch.Tensor:
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    out = None
    if x2.shape[0] <= GEMV_ROWS and x.dtype == torch.bfloat16:
        out = lowbit.gemv(x2, nibbles, high, scale, zero, group, planes)
    elif x.dtype == torch.bfloat16:
        out = lowbit.linear_t(x2, nibbles, high, scale, zero, group, planes)
    if out is None:
        w = lowbit.dequantize_bf16(nibbles, high, scale, zero, group, planes)
        ct = gemm.compute_dtype(x.dtype)
        out = torch.nn.functional.linear(x2.to(ct), w.to(ct)).to(x.dtype)
    return out.view(*x.shape[:-1], scale.shape[1])


def _lowbit_fake(x: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
                 zero: Optional[torch.Tensor], group: int, planes: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], scale.shape[1]))


def embedding_impl(ids: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                   zero: Optional[torch.Tensor], group: int) -> torch.Tensor:
    return int8.gather_rows(q, scale, zero, group, ids).view(*ids.shape, q.shape[1])


def _embedding_fake(ids: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    zero: Optional[torch.Tensor], group: int) -> torch.Tensor:
    return ids.new_empty((*ids.shape, q.shape[1]), dtype=torch.bfloat16)


def lowbit_embedding_impl(ids: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor,
                          scale: torch.Tensor, zero: Optional[torch.Tensor], group: int,
                          planes: int) -> torch.Tensor:
    return lowbit.gather(ids, nibbles, high, scale, zero, group, planes).view(*ids.shape, nibbles.shape[1])


def _lowbit_embedding_fake(ids: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor,
                           scale: torch.Tensor, zero: Optional[torch.Tensor], group: int,
                           planes: int) -> torch.Tensor:
    return ids.new_empty((*ids.shape, nibbles.shape[1]), dtype=torch.bfloat16)


def register() -> None:
    """Define the ops in vLLM's library once per process."""
    global _registered
    with _lock:
        if _registered:
            return
        from vllm.utils.torch_utils import direct_register_custom_op

        direct_register_custom_op(OP_NAME, linear_impl, mutates_args=[], fake_impl=_linear_fake)
        direct_register_custom_op(LOWBIT_OP_NAME, lowbit_impl, mutates_args=[], fake_impl=_lowbit_fake)
        lowbit_op.define(lowbit_impl)
        direct_register_custom_op(EMBED_OP_NAME, embedding_impl, mutates_args=[],
                                  fake_impl=_embedding_fake)
        direct_register_custom_op(LOWBIT_EMBED_OP_NAME, lowbit_embedding_impl, mutates_args=[],
                                  fake_impl=_lowbit_embedding_fake)
        _registered = True


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
           group: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    if not _registered:  # no lock on the hot path: dynamo cannot trace one
        register()
    out = getattr(torch.ops.vllm, OP_NAME)(x, q, scale, zero, group)
    return out if bias is None else out + bias


def lowbit_linear(x: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
                  zero: torch.Tensor | None, group: int, planes: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """A linear in :mod:`.lowbit`'s packed layout (``scale`` [K/g, N]): the C++ op of
    :mod:`.lowbit_op` where it loaded (bf16), else the Python custom op."""
    if not _registered:
        register()
    if _native_lowbit and x.dtype == torch.bfloat16:
        out = torch.ops.vllm_edge.lowbit_linear(x, nibbles, high, scale, zero, group, planes)
    else:
        out = getattr(torch.ops.vllm, LOWBIT_OP_NAME)(x, nibbles, high, scale, zero, group, planes)
    return out if bias is None else out + bias


def load_lowbit_op() -> bool:
    """Build and load the packed layers' C++ op once (at weight load, not in a traced call)."""
    global _native_lowbit
    if not _registered:
        register()
    _native_lowbit = lowbit_op.load(lowbit_impl)
    return _native_lowbit


def embedding(ids: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
              group: int) -> torch.Tensor:
    if not _registered:
        register()
    return getattr(torch.ops.vllm, EMBED_OP_NAME)(ids, q, scale, zero, group)


def lowbit_embedding(ids: torch.Tensor, nibbles: torch.Tensor, high: torch.Tensor, scale: torch.Tensor,
                     zero: torch.Tensor | None, group: int, planes: int) -> torch.Tensor:
    """Rows of an embedding packed in :mod:`.lowbit`'s layout, as bf16."""
    if not _registered:
        register()
    return getattr(torch.ops.vllm, LOWBIT_EMBED_OP_NAME)(ids, nibbles, high, scale, zero, group, planes)
