"""The ``cpu_int8`` method for the input embedding and the output head.

The head is a linear over the vocabulary (the op of :mod:`.int8_ops`); the lookup widens only
the requested rows, so no bf16 table is resident. A head tied to an 8-bit embedding reads the
embedding's tensors: one copy, as in the file it came from. Where :mod:`.lowbit`'s product runs,
the table (or an untied head) is packed at load as a linear is, and rows are looked up from
the packed table; so a tied head runs the packed product on the one copy.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from vllm_edge.quant import int8_ops
from vllm_edge.quant.int8_linear import PARAMS, Int8WeightsMixin
from vllm_edge.quant.linear import log_once

_SOURCE = "_cpu_int8_source"  # kept out of the module tree: a plain attribute


def _source(layer: torch.nn.Module) -> torch.nn.Module:
    return layer.__dict__.get(_SOURCE, layer)


class CpuInt8EmbeddingMethod(Int8WeightsMixin, QuantizeMethodBase):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if _SOURCE in layer.__dict__:
            return  # tied: the embedding owns the data
        self.finish(layer)
        self.pack_lowbit(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.matmul(_source(layer), x, bias)

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        src = _source(layer)
        if getattr(src, "lowbit_parts", None):
            (group, planes), = src.lowbit_parts  # a table is one part
            out = int8_ops.lowbit_embedding(input_, src.lowbit_nibbles, src.lowbit_high, src.lowbit_scale,
                                            src.lowbit_zero, group, planes)
        else:
            out = int8_ops.embedding(input_, src.weight_int8, src.weight_scale, src.weight_zero,
                                     src.cpu_int8_group)
        return out.to(self.params_dtype)

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module):
        for name in PARAMS:
            if name in layer._parameters:
                del layer._parameters[name]
        if isinstance(getattr(embed_tokens, "quant_method", None), CpuInt8EmbeddingMethod):
            layer.__dict__[_SOURCE] = embed_tokens
            return layer
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        log_once("tied-bf16-int8", "cpu_int8: %s is tied to an embedding not stored in 8 bits "
                 "and runs in bf16", self.prefix)
        layer.quant_method = UnquantizedEmbeddingMethod()
        layer.weight = embed_tokens.weight
        return layer
