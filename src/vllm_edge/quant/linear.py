"""The ``cpu_int4`` linear method: loads checkpoint-layout 4-bit weights through vLLM's
shard loaders, validates every tensor, and repacks in place to the tinygemm layout.

Checkpoint tensors per linear ``<prefix>``: ``weight_packed`` uint8 [N, K/2],
``weight_scale`` and ``weight_zero`` bf16 [N, ceil(K/group)] (see :mod:`.pack`).

Runtime modes, chosen once per layer in ``process_weights_after_loading``:

- ``tinygemm``: packed in place; the custom op routes by row count and dequantizes
  straight from the packed tensor (one resident copy);
- ``tinygemm+plain``: as above, plus a plain copy used for dequantization (when
  ``direct_dequant`` is off or the kernel layout changed);
- ``fallback``: shapes tinygemm cannot take (N not a multiple of 16, no kernel group
  size dividing K); always dequantize-then-GEMM from the plain layout. Logged once.

In ``tinygemm`` mode a layer whose every batch runs the native product calls the C++ op
``vllm_edge::int4_gemv`` (``cpu_int4_native_op``, decided at load by ``ops.native_op_for``);
the others call the Python op, which routes by row count.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.utils import set_weight_attrs

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant import ops, pack

logger = logging.getLogger("vllm_edge.quant")
_logged: set[str] = set()

PARAMS = ("weight_packed", "weight_scale", "weight_zero")
_QKV_INDEX = {"q": 0, "k": 1, "v": 2}


def log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning(msg, *args)


class CheckpointError(EdgeError, ValueError):
    """A cpu_int4 checkpoint tensor is missing or malformed."""


def _expected_rows(layer: torch.nn.Module, shard_id: Any) -> int:
    if shard_id is None:
        return int(getattr(layer, "org_vocab_size", None) or layer.output_size)
    if isinstance(shard_id, str):  # QKVParallelLinear
        heads = layer.total_num_heads if shard_id == "q" else layer.total_num_kv_heads
        size = layer.v_head_size if shard_id == "v" else layer.head_size
        return heads * size
    if isinstance(shard_id, tuple):
        return sum(layer.output_sizes[shard_id[0]:shard_id[-1] + 1])
    return layer.output_sizes[shard_id]


def checkpoint_name(quant_config, prefix: str, shard_id: Any, param: str) -> str:
    """The checkpoint tensor a shard of the (possibly fused) layer ``prefix`` loads, for messages."""
    base, _, last = prefix.rpartition(".")
    parts = quant_config.packed_modules_mapping.get(last)
    if shard_id is not None and parts:
        idx = _QKV_INDEX.get(shard_id, shard_id) if isinstance(shard_id, str) else shard_id
        if isinstance(idx, tuple):
            idx = idx[0]
        last = parts[idx]
    return f"{base}.{last}.{param}" if base else f"{last}.{param}"


def expected_shards(layer: torch.nn.Module) -> list[Any]:
    """The shard ids every parameter of ``layer`` must be loaded for (``None``: unfused)."""
    if hasattr(layer, "total_num_kv_heads"):
        return ["q", "k", "v"]
    if len(getattr(layer, "output_sizes", None) or []) > 1:
        return list(range(len(layer.output_sizes)))
    return [None]


class Int4WeightsMixin:
    """create/validate/repack shared by the linear and the embedding methods."""

    def __init__(self, quant_config, prefix: str = "") -> None:
        self.quant_config = quant_config
        self.prefix = prefix

    # --- names for error messages ---------------------------------------------------
    def checkpoint_name(self, shard_id: Any, param: str) -> str:
        return checkpoint_name(self.quant_config, self.prefix, shard_id, param)

    # --- weights ---------------------------------------------------------------------
    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        ops.register()
        self.params_dtype = params_dtype  # the embedding returns its rows in it
        self.make_weights(layer, input_size_per_partition, output_partition_sizes, input_size,
                          extra_weight_attrs["weight_loader"])

    def make_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                     output_partition_sizes: list[int], input_size: int,
                     weight_loader: Callable) -> None:
        group = self.quant_config.group_size
        n = sum(output_partition_sizes)
        k = input_size_per_partition
        if k % 2:
            raise CheckpointError(f"{self.prefix}: cpu_int4 needs an even input size, got {k}")
        if k != input_size and k % group:
            # vLLM hands each rank its slice of the scale columns, so a group cut in two
            # would give the second rank another group's scales: refuse, never run wrong
            raise CheckpointError(
                f"cpu_int4: {self.prefix} cannot be split over {input_size // k} tensor-parallel "
                f"ranks: its {input_size} input columns give each rank {k}, which is not a "
                f"multiple of the quantization group {group}, so a group would straddle two "
                "ranks. Use a tensor-parallel size that keeps whole groups per rank, or "
                "pipeline parallelism, or quantize with a group that divides the slice.")
        groups = math.ceil(k / group)
        specs = {
            "weight_packed": (torch.empty(n, k // 2, dtype=torch.uint8), {"packed_dim": 1, "packed_factor": 2}),
            # zeros, not empty: rows past the vocabulary (a rank's padding) are never loaded,
            # and the finiteness check at repack must not trip on leftover memory
            "weight_scale": (torch.zeros(n, groups, dtype=torch.bfloat16), {}),
            "weight_zero": (torch.zeros(n, groups, dtype=torch.bfloat16), {}),
        }
        layer.cpu_int4_loaded = {name: set() for name in specs}
        layer.cpu_int4_input_size = input_size
        for name, (data, attrs) in specs.items():
            p = Parameter(data, requires_grad=False)
            set_weight_attrs(p, {"input_dim": 1, "output_dim": 0, **attrs})
            set_weight_attrs(p, {"weight_loader": self._checked_loader(layer, name, weight_loader)})
            layer.register_parameter(name, p)

    def _checked_loader(self, layer: torch.nn.Module, name: str, loader: Callable) -> Callable:
        group = self.quant_config.group_size

        def load(param: Parameter, loaded: torch.Tensor, shard_id: Any = None, *args, **kwargs):
            where = self.checkpoint_name(shard_id, name)
            k_full = layer.cpu_int4_input_size
            if name == "weight_packed":
                cols, what, dtypes = k_full // 2, f"uint8 [rows, {k_full // 2}] (K={k_full} packed two per byte)", (torch.uint8, torch.int8)
            else:
                cols = math.ceil(k_full / group)
                what = f"float [rows, {cols}] (K={k_full} in groups of {group})"
                dtypes = (torch.bfloat16, torch.float16, torch.float32)
            rows = _expected_rows(layer, shard_id)
            if loaded.dim() != 2 or tuple(loaded.shape) != (rows, cols) or loaded.dtype not in dtypes:
                hint = ""
                if name != "weight_packed" and loaded.dim() == 2 and loaded.shape[0] == rows and loaded.shape[1]:
                    implied = math.ceil(k_full / loaded.shape[1])
                    hint = (f"; its {loaded.shape[1]} columns imply group size {implied}, but "
                            f"quantization_config.group_size is {group}")
                raise CheckpointError(
                    f"cpu_int4 checkpoint tensor {where}: expected {what} with rows={rows}, "
                    f"got {loaded.dtype} {list(loaded.shape)}{hint}"
                )
            if loaded.dtype == torch.int8:
                loaded = loaded.view(torch.uint8)
            layer.cpu_int4_loaded[name].add(shard_id)
            return loader(param, loaded.to(param.dtype), shard_id, *args, **kwargs) if shard_id is not None \
                else loader(param, loaded.to(param.dtype), *args, **kwargs)

        return load

    def _check_complete(self, layer: torch.nn.Module) -> None:
        shards = expected_shards(layer)
        missing = []
        for name in PARAMS:
            got = layer.cpu_int4_loaded[name]
            if None in got:
                continue
            missing += [self.checkpoint_name(s, name) for s in shards if s not in got]
        if missing:
            raise CheckpointError(
                "cpu_int4 checkpoint is missing tensor(s): " + ", ".join(missing)
                + " (every quantized linear needs weight_packed, weight_scale and weight_zero)"
            )

    def repack(self, layer: torch.nn.Module) -> None:
        self._check_complete(layer)
        del layer.cpu_int4_loaded
        for name in ("weight_scale", "weight_zero"):
            # A NaN or inf scale turns every output of the layer into NaN, silently.
            if not torch.isfinite(getattr(layer, name).data).all():
                raise CheckpointError(f"{self.prefix}.{name}: holds NaN or inf values; the "
                                      "checkpoint is damaged, quantize its source again")
        cfg = self.quant_config
        packed = layer.weight_packed.data
        n, half_k = packed.shape
        k = half_k * 2
        ok, why = pack.supports(n, k, cfg.group_size)
        layer.cpu_int4_threshold = cfg.effective_threshold
        layer.cpu_int4_group = cfg.group_size
        layer.cpu_int4_workspace_mb = cfg.dequant_workspace_mb
        layer.cpu_int4_native_op = False
        if not ok:
            layer.cpu_int4_mode = "fallback"
            log_once(f"fallback:{why}", "cpu_int4: %s uses dequantize-then-GEMM (%s); "
                     "further layers like it are not logged", self.prefix, why)
            return
        kgroup = pack.kernel_group(k, cfg.group_size)
        if kgroup != cfg.group_size:
            log_once(f"kgroup:{k}:{cfg.group_size}",
                     "cpu_int4: input size %d is not a multiple of group %d; running it as "
                     "exact groups of %d (duplicated scales)", k, cfg.group_size, kgroup)
        sz = pack.scales_and_zeros(layer.weight_scale.data, layer.weight_zero.data,
                                   cfg.group_size, k, kgroup)
        keep_plain = not (cfg.direct_dequant and pack.layout_matches())
        if keep_plain:
            if cfg.direct_dequant:
                log_once("layout", "cpu_int4: the installed tinygemm packing differs from the "
                         "measured layout; keeping a plain copy of each weight for dequantization")
            layer.register_parameter("weight_plain", Parameter(packed.clone(), requires_grad=False))
            layer.cpu_int4_mode = "tinygemm+plain"
        else:
            del layer.weight_scale, layer.weight_zero
            layer.cpu_int4_mode = "tinygemm"
        pack.repack_(packed)
        layer.register_parameter("weight_sz", Parameter(sz, requires_grad=False))
        layer.cpu_int4_kgroup = kgroup
        if not keep_plain:
            layer.cpu_int4_native_op = ops.native_op_for(packed, sz, kgroup, layer.cpu_int4_threshold,
                                                          self.params_dtype)

    def matmul(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        mode = layer.cpu_int4_mode
        if mode == "fallback":
            w = pack.dequantize_plain(layer.weight_packed, layer.weight_scale, layer.weight_zero,
                                      layer.cpu_int4_group, dtype=x.dtype)
            return torch.nn.functional.linear(x, w, bias)
        if layer.cpu_int4_native_op and x.dtype == torch.bfloat16:  # static for a compiled graph
            out = torch.ops.vllm_edge.int4_gemv.default(x, layer.weight_packed, layer.weight_sz,
                                                        layer.cpu_int4_kgroup)
            return out if bias is None else out + bias
        plain = (layer.weight_plain, layer.weight_scale, layer.weight_zero) if mode == "tinygemm+plain" else (None, None, None)
        return ops.int4_linear(x, layer.weight_packed, layer.weight_sz, layer.cpu_int4_kgroup,
                               layer.cpu_int4_threshold, *plain, layer.cpu_int4_group, bias=bias,
                               workspace_mb=layer.cpu_int4_workspace_mb)


class CpuInt4LinearMethod(Int4WeightsMixin, LinearMethodBase):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.repack(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.matmul(layer, x, bias)
