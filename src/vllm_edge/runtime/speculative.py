"""Speculative decoding through vLLM's own ``speculative_config``: n-gram prompt lookup.

A decode step reads every weight to produce one token. With n-gram prompt lookup, vLLM's
worker looks for the sequence's last few tokens earlier in the same sequence (prompt and
answer so far) and proposes the tokens that followed them there; the next step runs the model
on the last token and the proposals together and keeps the proposals up to the first one the
model would not have produced, plus one token of its own. There is no draft model: the
proposer is a string match (vLLM's ``NgramProposer``, numba). It pays when the answer copies
from its input (a summary, an edit of given text or code, a quotation), and costs a wider
step when a proposal is rejected.

Greedy answers are the model's own tokens. vLLM 0.32's CPU attention splits a lone query
row's keys between the threads (``VLLM_CPU_ATTN_SPLIT_KV``) and never a tile of several rows,
so a verification step and a plain step would round the same position differently and part
at a near tie; the edge engines turn the split off where each thread keeps a KV head
(:mod:`vllm_edge.runtime.attention_split`), and the ``cpu_int4`` path then gives bit-identical
logprobs with and without speculation (docs/guide/run.md#speculative-decoding). A bf16
build's oneDNN matmul also rounds a lone row differently from the same row in a batch.

``auto`` is n-gram lookup where the measurements say it pays: only while the request is the
only one running, and only while its recent proposals were kept
(:mod:`vllm_edge.runtime.speculative_gate`); otherwise the step is a plain one.

Torch-free: the CLI imports it for ``--help``.
"""

from __future__ import annotations

import copy
from typing import Any

METHODS = ("off", "ngram", "auto")
# A proposal follows a match of at least PROMPT_LOOKUP_MIN tokens (the longest match up to
# PROMPT_LOOKUP_MAX wins) and is at most NUM_SPECULATIVE_TOKENS long. Three tokens: in prose a
# two-token match ("of the") recurs by chance and its proposal is rejected more often, each
# rejection paying a step of five rows for one token; a match of four or more misses the
# shorter repeats of code and summaries. Four proposed tokens (VLLM_EDGE_NGRAM_TOKENS): 6 and 8
# gained on a rewrite and nothing outside the noise over the grounded prompts as a whole
# (benchmarks/results/grid/ngram_tokens/).
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
         "prompt_lookup_min": 3}
# ``auto``: the same proposals, checked only while the request runs alone (vLLM's batch-size
# schedule: 4 tokens at batch 1, none from batch 2 on) and only for a request whose recent
# proposals were kept (vllm_edge.runtime.speculative_gate). Batch 1 is where the grounded
# benchmark measured the gain; at batch 4 it measured none (0.99x, inside the noise), and a
# verification step then widens every request's step.
AUTO = {**NGRAM, "num_speculative_tokens_per_batch_size": [[1, 1, NGRAM["num_speculative_tokens"]],
                                                            [2, 2, 0]]}
# Sampling values vLLM 0.32 refuses in a request once speculation is on
# (SamplingParams._validate_spec_decode), with the value it accepts: min_p; logit_bias too,
# which no server default sets.
NEUTRAL_DEFAULTS = {"min_p": 0.0}


def proposal_tokens() -> int:
    """How many tokens one proposal holds at most: ``VLLM_EDGE_NGRAM_TOKENS``."""
    from vllm_edge import envs

    return int(envs.get("VLLM_EDGE_NGRAM_TOKENS"))


def engine_config(method: str) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``method`` (None: off). ValueError for an unknown one."""
    if method not in METHODS:
        raise ValueError(f"--speculative {method!r}: expected one of {', '.join(METHODS)}")
    if method == "off":
        return None
    cfg = copy.deepcopy(NGRAM if method == "ngram" else AUTO)  # vLLM may keep and alter it
    cfg["num_speculative_tokens"] = proposal_tokens()
    if method == "auto":  # its batch-1 entry proposes as many
        cfg["num_speculative_tokens_per_batch_size"][0][2] = cfg["num_speculative_tokens"]
    return cfg


def reason(method: str) -> str:
    if method == "off":
        return "off: one token per decode step"
    if method == "auto":
        return ("auto: n-gram prompt lookup while the request runs alone and its recent "
                "proposals were kept (at least half a token each), one token per step otherwise; "
                "requests with min_p or logit_bias are refused")
    return (f"n-gram prompt lookup: after a match of {NGRAM['prompt_lookup_min']} to "
            f"{NGRAM['prompt_lookup_max']} tokens earlier in the sequence, up to "
            f"{proposal_tokens()} proposed tokens are checked in one step; greedy "
            "answers keep the model's tokens (up to rounding); requests with min_p or "
            "logit_bias are refused")


def accepted_defaults(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Server sampling defaults vLLM accepts with speculation on, and the ones replaced
    (name -> the value it had).

    A server default applies to every request that does not set the value itself, so a
    refused one would fail every such request with a 400. The neutral value is sent rather
    than the key dropped: vLLM lays the server's values over the model's own
    generation_config.json, which may name the refused one too."""
    replaced = {k: values[k] for k, v in NEUTRAL_DEFAULTS.items() if values.get(k, v) != v}
    return {**values, **{k: NEUTRAL_DEFAULTS[k] for k in replaced}}, replaced
