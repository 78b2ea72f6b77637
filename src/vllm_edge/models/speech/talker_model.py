"""The talker's vLLM model class: vLLM's Llama with a codec-only head whose logits carry one
whole codec frame per step (:mod:`.talker` describes the layout and the trick).

Registered with vLLM's ``ModelRegistry`` by the plugin under ``EdgeTalkerForCausalLM``, lazily:
this module (and vLLM's Llama) is imported only when a talker checkpoint is loaded.
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.utils import maybe_prefix

from vllm_edge.models.speech import talker


class EdgeTalkerForCausalLM(LlamaForCausalLM):
    """Llama body; ``lm_head`` holds the codec rows only (``head_rows`` of them). Each step's
    logits are :func:`talker.step_logits` of the codes :func:`talker.choose` picks (greedy)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        self.speech = talker.TalkerSpec.from_config(getattr(config, talker.CONFIG_KEY, None))
        if config.vocab_size != self.speech.vocab:
            raise talker.TalkerError(f"config.json: field vocab_size={config.vocab_size}, but "
                                     f"{talker.CONFIG_KEY}.vocab={self.speech.vocab}")
        if config.tie_word_embeddings:
            raise talker.TalkerError("config.json: field tie_word_embeddings=true; a talker's "
                                     "head is its own (codec rows only)")
        if get_pp_group().is_last_rank:
            # replaces the full-vocabulary head Llama made: a talker never scores text tokens
            self.lm_head = ParallelLMHead(self.speech.head_rows, config.hidden_size,
                                          quant_config=vllm_config.quant_config,
                                          prefix=maybe_prefix(prefix, "lm_head"))
            self.logits_processor = LogitsProcessor(self.speech.head_rows)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        head = self.logits_processor(self.lm_head, hidden_states)
        if head is None:
            return None
        codes, ended = talker.choose(head, self.speech)
        return talker.step_logits(codes, ended, self.speech)
