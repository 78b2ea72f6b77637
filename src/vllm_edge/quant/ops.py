"""The W4A16 linear as one vLLM custom op: ``torch.ops.vllm.edge_cpu_int4_linear``.

Batches up to ``dequant_threshold`` rows run a product straight from the packed weight:
our AVX512-BF16 kernel (``native.gemv``) where it builds, our AVX2 one for the 32-row
packing where that does, else tinygemm
(``_weight_int4pack_mm_for_cpu``). Both unpack the weight once per pass, so their cost grows
with the row count; above the threshold a dequantize-then-bf16-GEMM pays the unpacking
once. The choice depends on the row count, and it is made *inside* an opaque custom op so
dynamo never specialises or guards on the batch size. The fake impl only computes the
output shape.

A layer whose every batch runs the native product calls ``torch.ops.vllm_edge.int4_gemv``
instead (``native_op.py``: a C++ kernel, no Python between the dispatcher and the C product);
:func:`native_op_for` decides once per layer, at load.
"""

import threading
from typing import Optional

import torch

from vllm_edge.quant import gemm, native, native_op, pack

OP_NAME = "edge_cpu_int4_linear"
EMBED_OP_NAME = "edge_cpu_int4_embedding"
# Rows above which dequantize-then-GEMM beats tinygemm. With the native dequantizer
# (native.py) the crossover sits between 32 and 64 rows at SmolLM2 and 1B shapes
# (benchmarks/results/cpu_int4_microbench_prefill.json; docs/design/cpu-int4.md); with the
# torch-op fallback it is far higher, so a build without a C compiler loses some prefill speed.
DEFAULT_DEQUANT_THRESHOLD = 48
NEVER = 1 << 62  # a threshold that keeps every batch on the packed-weight product
# dequant_threshold "auto" (the quantizer's default), passed to the op as AUTO and
# resolved there by auto_threshold().
AUTO_NAME = "auto"
AUTO = -1
# Cap of the one reusable bf16 buffer the multi-row route dequantizes into (native.py).
# 32 MB holds a whole 4096x4096 layer; larger ones run in chunks of output rows.
DEFAULT_WORKSPACE_MB = 32

_lock = threading.Lock()
_registered = False


def auto_threshold() -> int:
    """What "auto" amounts to here: the native product runs every batch size (at 512 rows it
    is within ~5-10 % of prepacked oneDNN bf16 and needs no workspace); where it does not
    build, tinygemm hands over to dequantize + GEMM above 48 rows. A layer the product
    refuses (N not a multiple of 64) takes the tinygemm/dequantize split too."""
    return NEVER if native.gemv_supported() else DEFAULT_DEQUANT_THRESHOLD


def describe() -> dict:
    """Which cpu_int4 kernels run in this process, for ``vllm-edge doctor``."""
    lib = native.library()
    product = native.gemv_supported()
    threshold = auto_threshold()
    return {
        "library": getattr(lib, "_name", None),
        "small_batches": ("native product (quant/csrc/int4_gemv.c)" if product else
                          "native product (quant/csrc/int4_gemv32.c)" if native.gemv32_supported() else
                          "tinygemm"),
        "large_batches": ("native product" if product else
                          "native dequantize + bf16 GEMM" if lib is not None else
                          "torch-op dequantize + bf16 GEMM"),
        "auto_threshold_rows": None if threshold == NEVER else threshold,
        "native_op": native_op.state(),
    }


def int4_linear_impl(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                     group_size: int, dequant_threshold: int,
                     plain: Optional[torch.Tensor] = None, plain_scale: Optional[torch.Tensor] = None,
                     plain_zero: Optional[torch.Tensor] = None, plain_group: int = 0,
                     workspace_mb: int = DEFAULT_WORKSPACE_MB) -> torch.Tensor:
    k = x.shape[-1]
    n = scales_zeros.shape[1]
    x2 = x.reshape(-1, k)
    auto = dequant_threshold < 0
    if auto:
        dequant_threshold = DEFAULT_DEQUANT_THRESHOLD
    out = None
    # "auto" tries the product at every batch size. It reads the measured layout, so never
    # with a plain copy (kept because the installed packing differs from it).
    if plain is None and (auto or x2.shape[0] <= dequant_threshold):
        out = native.gemv(x2, packed, scales_zeros, group_size, max_rows=dequant_threshold)
    if out is None and x2.shape[0] > dequant_threshold:
        ct = gemm.compute_dtype(x.dtype)
        if plain is not None:
            w = pack.dequantize_plain(plain, plain_scale, plain_zero, plain_group, dtype=ct)
            out = torch.nn.functional.linear(x2.to(ct), w).to(x.dtype)
        else:
            out = native.linear(x2, packed, scales_zeros, group_size, workspace_mb << 20)
            if out is None:  # no native kernel (logged once) or not bf16
                wt = pack.dequantize_packed_t(packed, scales_zeros, group_size, dtype=ct)
                out = torch.matmul(x2.to(ct), wt).to(x.dtype)
    elif out is None:
        sz = scales_zeros if scales_zeros.dtype == x.dtype else scales_zeros.to(x.dtype)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), packed, group_size, sz)
    return out.view(*x.shape[:-1], n)


def _fake(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
          group_size: int, dequant_threshold: int,
          plain: Optional[torch.Tensor] = None, plain_scale: Optional[torch.Tensor] = None,
          plain_zero: Optional[torch.Tensor] = None, plain_group: int = 0,
          workspace_mb: int = DEFAULT_WORKSPACE_MB) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], scales_zeros.shape[1]))


def int4_embedding_impl(ids: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                        group_size: int) -> torch.Tensor:
    k = scales_zeros.shape[0] * group_size
    # the torch-op gather costs ~3% of a 512-token prefill on SmolLM2; the C one ~0.1%
    rows = native.gather_rows(packed, scales_zeros, group_size, ids)
    if rows is None:
        rows = pack.gather_rows_packed(packed, scales_zeros, group_size, ids, dtype=scales_zeros.dtype)
    return rows.view(*ids.shape, k)


def _int4_gemv_fallback(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                        group_size: int) -> torch.Tensor:
    """``vllm_edge::int4_gemv`` where its C++ kernel is not loaded (a graph compiled by a
    process that had it): the Python op's routes."""
    return int4_linear_impl(x, packed, scales_zeros, group_size, AUTO)


def native_op_for(packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
                  dequant_threshold: int, dtype: torch.dtype) -> bool:
    """Whether a layer (no plain copy) calls ``vllm_edge::int4_gemv``: its route must be the
    product at every batch size (threshold "auto" or NEVER, bf16, N % 64 == 0, K and the group
    multiples of 32, contiguous tensors) and the C++ kernel must load here (built on first
    use; ``native_op.load``)."""
    n, k = packed.shape[0], scales_zeros.shape[0] * group_size
    if (dtype != torch.bfloat16 or scales_zeros.dtype != torch.bfloat16
            or dequant_threshold not in (AUTO, NEVER) or n % 64 or k % 32 or group_size % 32
            or not (packed.is_contiguous() and scales_zeros.is_contiguous())):
        return False
    register()
    return native_op.load()


def _embedding_fake(ids: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    return ids.new_empty((*ids.shape, scales_zeros.shape[0] * group_size), dtype=scales_zeros.dtype)


def register() -> None:
    """Define the op in vLLM's library once per process."""
    global _registered
    with _lock:
        if _registered:
            return
        from vllm.utils.torch_utils import direct_register_custom_op

        direct_register_custom_op(OP_NAME, int4_linear_impl, mutates_args=[], fake_impl=_fake)
        direct_register_custom_op(EMBED_OP_NAME, int4_embedding_impl, mutates_args=[],
                                  fake_impl=_embedding_fake)
        native_op.define(_int4_gemv_fallback)
        _registered = True


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                group_size: int, dequant_threshold: int,
                plain: torch.Tensor | None = None, plain_scale: torch.Tensor | None = None,
                plain_zero: torch.Tensor | None = None, plain_group: int = 0,
                bias: torch.Tensor | None = None,
                workspace_mb: int = DEFAULT_WORKSPACE_MB) -> torch.Tensor:
    if not _registered:  # no lock on the hot path: dynamo cannot trace one
        register()
    out = getattr(torch.ops.vllm, OP_NAME)(x, packed, scales_zeros, group_size, dequant_threshold,
                                           plain, plain_scale, plain_zero, plain_group, workspace_mb)
    return out if bias is None else out + bias


def int4_embedding(ids: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                   group_size: int) -> torch.Tensor:
    """Rows of the dequantized table, gathered from the packed data (data-dependent
    branches on the ids stay inside the op)."""
    if not _registered:  # no lock on the hot path: dynamo cannot trace one
        register()
    return getattr(torch.ops.vllm, EMBED_OP_NAME)(ids, packed, scales_zeros, group_size)
