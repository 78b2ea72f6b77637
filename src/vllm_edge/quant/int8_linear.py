"""The ``cpu_int8`` linear method: checkpoint-layout 8-bit weights loaded through vLLM's shard
loaders, every tensor validated, and run by the custom op of :mod:`.int8_ops`.

Checkpoint tensors per linear ``<prefix>``: ``weight_int8`` int8 [N, K], ``weight_scale`` and
``weight_zero`` fp16 [N, K / group] (:mod:`.int8`). The layout is the runtime layout: nothing
is repacked after loading. An all-zero offset (the quantizer's symmetric codes, llama.cpp's
Q8_0, Q5_0 and Q6_K) is dropped at load, so the product does not read it. Where :mod:`.lowbit`'s
product runs, the codes are then repacked in place into its 64-row layout: 5 or 6 bits per
weight for codes that fit (llama.cpp's 5- and 6-bit blocks), two nibble planes for 8-bit ones.
A fused layer (q/k/v, gate/up) whose parts differ (a Q4_K q and k beside a Q6_K v, as a Q4_K_M
file mixes them) is packed part by part, each at its own planes and group, and runs one product
per part: its 4-bit rows are read at 4 bits, not at the 6 of the layer's widest part.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.utils import set_weight_attrs

from vllm_edge.quant import int8_ops
from vllm_edge.quant.linear import CheckpointError, _expected_rows, checkpoint_name, expected_shards

PARAMS = ("weight_int8", "weight_scale", "weight_zero")
_TRIM_EVERY = 8
_packed_since_trim = [0]


def lowbit_name(what: str, part: int) -> str:
    """The layer attribute of a packed tensor (``nibbles``, ``high``, ``scale``, ``zero``) of a part."""
    return f"lowbit_{what}" if part == 0 else f"lowbit_{what}_{part}"


class Int8WeightsMixin:
    """create/validate shared by the linear and the embedding methods."""

    def __init__(self, quant_config, prefix: str = "") -> None:
        self.quant_config = quant_config
        self.prefix = prefix

    def checkpoint_name(self, shard_id: Any, param: str) -> str:
        return checkpoint_name(self.quant_config, self.prefix, shard_id, param)

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        int8_ops.register()
        self.params_dtype = params_dtype
        group = self.quant_config.group_size
        n, k = sum(output_partition_sizes), input_size_per_partition
        if k % group:
            raise CheckpointError(
                f"cpu_int8: {self.prefix} has {k} input columns per rank, not a multiple of the "
                f"group {group}" + (f" (tensor parallel splits its {input_size} columns)"
                                    if k != input_size else ""))
        specs = {
            "weight_int8": torch.zeros(n, k, dtype=torch.int8),
            # zeros, not empty: rows past the vocabulary (a rank's padding) are never loaded,
            # and the finiteness check must not trip on leftover memory
            "weight_scale": torch.zeros(n, k // group, dtype=torch.float16),
            "weight_zero": torch.zeros(n, k // group, dtype=torch.float16),
        }
        layer.cpu_int8_loaded = {name: set() for name in specs}
        layer.cpu_int8_input_size = input_size
        loader = extra_weight_attrs["weight_loader"]
        for name, data in specs.items():
            p = Parameter(data, requires_grad=False)
            set_weight_attrs(p, {"input_dim": 1, "output_dim": 0,
                                 "weight_loader": self._checked_loader(layer, name, loader)})
            layer.register_parameter(name, p)

    def _checked_loader(self, layer: torch.nn.Module, name: str, loader: Callable) -> Callable:
        group = self.quant_config.group_size

        def load(param: Parameter, loaded: torch.Tensor, shard_id: Any = None, *args, **kwargs):
            where = self.checkpoint_name(shard_id, name)
            k_full = layer.cpu_int8_input_size
            rows = _expected_rows(layer, shard_id)
            if name == "weight_int8":
                cols, dtypes, what = k_full, (torch.int8,), f"int8 [rows, {k_full}]"
            else:
                cols, dtypes = k_full // group, (torch.float16,)
                what = f"float16 [rows, {cols}] (K={k_full} in groups of {group})"
            if loaded.dim() != 2 or tuple(loaded.shape) != (rows, cols) or loaded.dtype not in dtypes:
                raise CheckpointError(f"cpu_int8 checkpoint tensor {where}: expected {what} with "
                                      f"rows={rows}, got {loaded.dtype} {list(loaded.shape)}")
            layer.cpu_int8_loaded[name].add(shard_id)
            if shard_id is None:
                return loader(param, loaded, *args, **kwargs)
            return loader(param, loaded, shard_id, *args, **kwargs)

        return load

    def finish(self, layer: torch.nn.Module) -> None:
        """Check every shard arrived and the scales are finite; drop an all-zero offset."""
        shards = expected_shards(layer)
        missing = []
        for name in PARAMS:
            got = layer.cpu_int8_loaded[name]
            if None not in got:
                missing += [self.checkpoint_name(s, name) for s in shards if s not in got]
        if missing:
            raise CheckpointError("cpu_int8 checkpoint is missing tensor(s): " + ", ".join(missing)
                                  + " (every 8-bit linear needs weight_int8, weight_scale and weight_zero)")
        del layer.cpu_int8_loaded
        for name in ("weight_scale", "weight_zero"):
            if not torch.isfinite(getattr(layer, name).data).all():
                raise CheckpointError(f"{self.prefix}.{name}: holds NaN or inf values; the "
                                      "checkpoint is damaged, build it again")
        layer.cpu_int8_group = self.quant_config.group_size
        if not layer.weight_zero.data.any():
            del layer.weight_zero
            layer.weight_zero = None

    def pack_lowbit(self, layer: torch.nn.Module) -> None:
        """The codes move to the packed layout of :mod:`.lowbit` (the same values; about the
        file's bytes per weight for 5- and 6-bit codes); the int8 codes are freed. A layer the
        packed product cannot take (a shape outside whole 64-row blocks) keeps them."""
        from vllm_edge.quant import lowbit

        if not lowbit.supported():
            return
        zero = layer.weight_zero.data if layer.weight_zero is not None else None
        sizes = list(getattr(layer, "output_partition_sizes", None) or [layer.weight_int8.shape[0]])
        parts = lowbit.pack_parts(layer.weight_int8.data, layer.weight_scale.data, zero,
                                  layer.cpu_int8_group, sizes)
        if parts is None:  # a shape outside whole 64-row blocks
            return
        for name in PARAMS:
            if isinstance(getattr(layer, name, None), Parameter):
                delattr(layer, name)
            setattr(layer, name, None)
        for i, packed in enumerate(parts):
            for what, t in (("nibbles", packed.nibbles), ("high", packed.high),
                            ("scale", packed.scale), ("zero", packed.zero)):
                name = lowbit_name(what, i)
                if t is None:
                    setattr(layer, name, None)
                else:
                    layer.register_parameter(name, Parameter(t, requires_grad=False))
        layer.lowbit_parts = tuple((p.group, p.planes) for p in parts)
        int8_ops.load_lowbit_op()
        _packed_since_trim[0] += 1
        if _packed_since_trim[0] >= _TRIM_EVERY:
            # each layer frees its int8 codes between the load's long-lived tensors: without a
            # trim now and then the freed holes add up (about 140 MB over SmolLM2's 120 layers)
            from vllm_edge.runtime import memory

            memory.trim()
            _packed_since_trim[0] = 0

    def matmul(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        parts = getattr(layer, "lowbit_parts", None)
        if parts:
            ys = [int8_ops.lowbit_linear(x, *(getattr(layer, lowbit_name(what, i))
                                              for what in ("nibbles", "high", "scale", "zero")), group, planes)
                  for i, (group, planes) in enumerate(parts)]
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
            return y if bias is None else y + bias
        return int8_ops.linear(x, layer.weight_int8, layer.weight_scale, layer.weight_zero,
                               layer.cpu_int8_group, bias=bias)


class CpuInt8LinearMethod(Int8WeightsMixin, LinearMethodBase):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.finish(layer)
        self.pack_lowbit(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.matmul(layer, x, bias)
