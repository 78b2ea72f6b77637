"""The ``cpu_int4`` method for the input embedding and the output head.

One class serves both: the head is a linear over the vocabulary (the same custom op as
the other linears), and the embedding lookup gathers rows from the packed 4-bit data and
dequantizes only those rows, so no bf16 table is resident.

When the model ties the head to the embedding, the head reads the embedding's packed
tensors (one resident copy). A head tied to an *unquantized* embedding (a checkpoint with
``quantize_embedding: false`` and a tied config) stays in bf16 and says so once; the
``vllm-edge quantize`` exporter unties the head to avoid that.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from vllm_edge.quant import ops, pack
from vllm_edge.quant.linear import PARAMS, Int4WeightsMixin, log_once

_SOURCE = "_cpu_int4_source"  # kept out of the module tree: a plain attribute


def _source(layer: torch.nn.Module) -> torch.nn.Module:
    return layer.__dict__.get(_SOURCE, layer)


class CpuInt4EmbeddingMethod(Int4WeightsMixin, QuantizeMethodBase):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if _SOURCE in layer.__dict__:
            return  # tied: the embedding owns (and repacks) the data
        self.repack(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.matmul(_source(layer), x, bias)

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        src = _source(layer)
        if src.cpu_int4_mode == "fallback":
            q = pack.unpack_nibbles(src.weight_packed[input_.reshape(-1)])
            rows = input_.reshape(-1)
            s = pack.expand_groups(src.weight_scale[rows].float(), src.cpu_int4_group, q.shape[1])
            z = pack.expand_groups(src.weight_zero[rows].float(), src.cpu_int4_group, q.shape[1])
            out = ((q.float() - 8) * s + z).view(*input_.shape, q.shape[1])
        else:
            out = ops.int4_embedding(input_, src.weight_packed, src.weight_sz, src.cpu_int4_kgroup)
        return out.to(self.params_dtype)

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module):
        for name in PARAMS:
            if name in layer._parameters:
                del layer._parameters[name]
        if isinstance(getattr(embed_tokens, "quant_method", None), CpuInt4EmbeddingMethod):
            layer.__dict__[_SOURCE] = embed_tokens
            return layer
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        log_once("tied-bf16", "cpu_int4: %s is tied to an unquantized embedding and runs in "
                 "bf16; quantize with `vllm-edge quantize` (it unties the head)", self.prefix)
        layer.quant_method = UnquantizedEmbeddingMethod()
        layer.weight = embed_tokens.weight
        return layer
