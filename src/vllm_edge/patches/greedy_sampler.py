"""Greedy batches skip the float32 copy of the logits (docs/design/patches.md).

vLLM 0.32.0's ``Sampler.forward`` copies the whole ``[batch, vocab]`` logits to float32 at
every step, runs the logits-processor chain, then takes the argmax. When every request is
greedy and nothing in the batch can change the argmax or asks for logprobs, that is an
allocation, a copy and a dozen Python calls for the same token: the patch takes the argmax
on the logits in their own dtype and returns the ``SamplerOutput`` vLLM would. A bf16 or fp16
value converts to float32 exactly, so the maximum and its first index (the one both
argmaxes return on ties; NaN counts as the maximum in both) are unchanged. Every other batch
runs the original method.

``fast_steps`` and ``fallback_steps`` count the two routes in this process.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from vllm_edge.patches import Patch, check_params, source_of

# Steps this process sampled on the fast path / handed to the original.
fast_steps = 0
fallback_steps = 0

# SamplingMetadata fields of vLLM 0.32.0, each either checked in _fast_path_allowed or
# unused by upstream's all-greedy route (temperature, top_p, top_k, generators, the
# penalty tensors, output/prompt token ids: read only for random sampling or penalties).
# A field outside this set is new upstream: the patch refuses to apply instead of guessing.
_KNOWN_FIELDS = frozenset({
    "temperature", "all_greedy", "all_random", "top_p", "top_k", "generators",
    "max_num_logprobs", "no_penalties", "prompt_token_ids", "frequency_penalties",
    "presence_penalties", "repetition_penalties", "output_token_ids",
    "allowed_token_ids_mask", "bad_words_token_ids", "logitsprocs", "logprob_token_ids",
    "spec_token_ids", "thinking_budget_state_holder",
})
_FORWARD_PARAMS = ("self", "logits", "sampling_metadata", "predict_bonus_token",
                   "logprobs_mode_override")


def _inert_processors() -> dict[type, str]:
    """Built-in argmax-changing processors -> the attribute that is empty when they have
    nothing to do (their own ``apply`` returns the logits untouched then)."""
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    return {LogitBiasLogitsProcessor: "biases", MinTokensLogitsProcessor: "min_toks"}


def _fast_path_allowed(md: Any, predict_bonus_token: bool, inert: dict[type, str]) -> bool:
    if not md.all_greedy or predict_bonus_token:
        return False
    if md.max_num_logprobs is not None or md.logprob_token_ids:
        return False
    if not md.no_penalties or md.bad_words_token_ids or md.allowed_token_ids_mask is not None:
        return False
    holder = md.thinking_budget_state_holder
    if holder is not None and holder.has_tracked_requests():
        return False
    for proc in md.logitsprocs.non_argmax_invariant:
        attr = inert.get(type(proc))  # exact type: a subclass may apply more
        if attr is None or getattr(proc, attr):
            return False
    return True


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    return "logits.to(torch.float32)" not in src


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    import torch
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.metadata import SamplingMetadata

    unknown = {f.name for f in dataclasses.fields(SamplingMetadata)} - _KNOWN_FIELDS
    if unknown:
        raise LookupError(f"SamplingMetadata has fields the greedy fast path was not written "
                          f"for: {sorted(unknown)}")
    check_params("Sampler.forward", original, _FORWARD_PARAMS)
    inert = _inert_processors()
    exact = (torch.bfloat16, torch.float16)  # widen to float32 without rounding

    @functools.wraps(original)
    def forward(self: Any, logits: Any, sampling_metadata: Any,
                predict_bonus_token: bool = False, logprobs_mode_override: Any = None) -> Any:
        global fast_steps, fallback_steps
        if (logits.dtype in exact or logits.dtype == torch.float32) and _fast_path_allowed(
                sampling_metadata, predict_bonus_token, inert):
            if logits.dtype == torch.float32:
                sampled = self.greedy_sample(logits)  # upstream's own op on its own dtype
            else:
                sampled = logits.argmax(dim=-1).view(-1)
            fast_steps += 1
            return SamplerOutput(sampled_token_ids=sampled.to(torch.int32).unsqueeze(-1),
                                 logprobs_tensors=None)
        fallback_steps += 1
        return original(self, logits, sampling_metadata, predict_bonus_token,
                        logprobs_mode_override)

    forward.__vllm_edge_patch__ = "greedy_sampler"
    return forward


PATCH = Patch(
    name="greedy_sampler",
    target="vllm.v1.sample.sampler:Sampler.forward",
    reason=(
        "every step copies the whole logits to float32 and runs the logits-processor chain, "
        "also for an all-greedy batch where nothing can change the argmax"
    ),
    fixed_when="Sampler.forward no longer upcasts the logits with logits.to(torch.float32)",
    env_switch="VLLM_EDGE_PATCH_GREEDY_SAMPLER",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
