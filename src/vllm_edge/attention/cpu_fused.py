"""vLLM's CPU attention backend with the KV-cache write inside the attention op.

vLLM 0.32's CPU backend declares ``forward_includes_kv_cache_update = False``, so every
attention layer runs two Python custom ops per forward: ``unified_kv_cache_update`` (the
write) and ``unified_attention_with_output``, each looking the layer up in the forward
context and splitting the cache tensor into key and value views again. Here the impl
writes the cache itself and then attends, so a layer costs one op; its views are kept
per layer (the impl is per layer) until the cache tensor object changes.

Same C ops and the same arguments as upstream: the write is ``cpu_attn_reshape_and_cache``
with ``layer.isa`` (set by the inherited metadata builder through ``_get_attn_isa``, so
the ``amx_attention`` patch still applies), the attention ``cpu_attention_with_kv_cache``.
Encoder attention keeps upstream's path, which already writes its scratch cache inside
``forward``.
"""

from __future__ import annotations

import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

# Attention types whose cache is the paged KV cache the separate update op would write.
_PAGED = (AttentionType.DECODER, AttentionType.ENCODER_DECODER)


class FusedKVCPUAttentionImpl(CPUAttentionBackendImpl):
    _kv_cache: torch.Tensor | None = None
    _kv_views: tuple[torch.Tensor, torch.Tensor] | None = None

    def kv_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_cache, value_cache) of ``kv_cache``, split once per cache tensor.

        ``kv_cache`` is [num_blocks, num_kv_heads, block_size, 2 * head_size]; the views are
        [num_blocks, num_kv_heads, block_size, head_size] each, as upstream's ``forward``
        makes them. Identity, not equality: a re-bound cache is a new tensor object, and the
        strong reference keeps its id from being reused while the views are cached.
        """
        if kv_cache is not self._kv_cache:
            num_blocks, num_kv_heads, block_size, _ = kv_cache.size()
            split = kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
            self._kv_views = (split[0], split[1])
            self._kv_cache = kv_cache
        return self._kv_views  # type: ignore[return-value]

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if (attn_metadata is None or self.attn_type not in _PAGED
                or output_scale is not None or output_block_scale is not None):
            # warm-up, encoder attention, or an error upstream raises: upstream's code
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        key_cache, value_cache = self.kv_views(kv_cache)
        # What Attention.forward skips for this backend: no write for a layer that shares
        # an earlier layer's cache, nor for cross-attention steps without new keys.
        if self.kv_sharing_target_layer_name is None and key is not None and value is not None:
            slot_mapping = attn_metadata.slot_mapping
            if key.shape[0] != slot_mapping.shape[0]:
                # The runner pads the slot mapping only for a separate update op.
                key, value = key[:slot_mapping.shape[0]], value[:slot_mapping.shape[0]]
            ops.cpu_attn_reshape_and_cache(
                key, value, key_cache, value_cache, slot_mapping, layer.isa,
                k_scale=layer._k_scale_float, v_scale=layer._v_scale_float,
                kv_cache_dtype=self.kv_cache_dtype,
            )
        # As upstream: the kernel runs sinks natively in bf16, anything else in fp32.
        if self.sinks is not None and self.sinks.dtype not in (torch.bfloat16, torch.float32):
            self.sinks = self.sinks.to(torch.float32)
        n = attn_metadata.num_actual_tokens
        ops.cpu_attention_with_kv_cache(
            query=query[:n],
            key_cache=key_cache,
            value_cache=value_cache,
            output=output[:n],
            query_start_loc=attn_metadata.query_start_loc,
            seq_lens=attn_metadata.seq_lens,
            scale=self.scale,
            causal=attn_metadata.causal,
            alibi_slopes=self.alibi_slopes,
            sliding_window=self.sliding_window,
            block_table=attn_metadata.block_table,
            softcap=self.logits_soft_cap,
            scheduler_metadata=attn_metadata.scheduler_metadata,
            s_aux=self.sinks,
            dynamic_causal=attn_metadata.dynamic_causal,
            k_scale=layer._k_scale_float,
            v_scale=layer._v_scale_float,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        return output


class FusedKVCPUAttentionBackend(CPUAttentionBackend):
    """Upstream's CPU backend (name ``CPU_ATTN``, same metadata builder, same cache layout)
    whose forward includes the KV-cache write, so ``Attention.forward`` skips
    ``unified_kv_cache_update``."""

    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_impl_cls() -> type[FusedKVCPUAttentionImpl]:
        return FusedKVCPUAttentionImpl
