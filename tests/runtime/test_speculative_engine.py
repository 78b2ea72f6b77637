"""N-gram speculative decoding through vLLM's own speculative_config, on the default model's
cpu_int4 build: greedy tokens equal plain decoding's on a prompt whose answer copies its input,
and vLLM's counters show the proposals were checked and kept. One eager engine per arm."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import speculative
from vllm_edge.runtime.engine import edge_engine
from vllm_edge.serving.run import spec_decode_counts

pytestmark = pytest.mark.slow

PARAGRAPH = ("The lighthouse stood on the northern cliff for two hundred years. Every night the "
             "keeper climbed the spiral stairs, trimmed the wick, and wound the clockwork that "
             "turned the lens. Ships passing the reef saw the beam sweep the water every ten "
             "seconds, and they knew to keep their distance from the rocks below.")
PROMPT = "Repeat the following paragraph word for word:\n\n" + PARAGRAPH
MAX_TOKENS = 48


# bench grounded's measurement, on the same engines: one copying prompt and one chat prompt
GROUNDED = (("rewrite", PROMPT), ("chat", "Tell me a joke about a cat."))


def _answer(llm):
    from vllm import SamplingParams

    out = llm.chat([{"role": "user", "content": PROMPT}],
                   SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), spec_decode_counts(llm.get_metrics())


def _answer_and_measure(llm):
    from vllm_edge.bench import grounded

    return (*_answer(llm), grounded.measure(llm, llm.get_tokenizer(), reps=1, max_tokens=24,
                                            prompts=GROUNDED))


@pytest.fixture(scope="module")
def arms(default_int4_dir, run_llm):
    # vLLM's attention splits a lone query row's keys between the threads (VLLM_CPU_ATTN_SPLIT_KV),
    # so a one-row step and a verification step round differently; at a near tie the greedy
    # choice then depends on the host (the same on the AVX-512 EPYC, not on an AVX2 one). Off in
    # both arms, the cpu_int4 logprobs are bit-identical (docs/guide/run.md#speculative-decoding).
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_ATTN_SPLIT_KV", "0")
        _both(out, default_int4_dir, run_llm)
    return out


def _both(out, default_int4_dir, run_llm):
    for method in speculative.METHODS:
        edge = edge_engine(default_int4_dir, max_model_len=512, max_num_seqs=1, enforce_eager=True,
                           max_num_batched_tokens=128, speculative=method)
        out[method] = (edge.kwargs, *run_llm(_answer_and_measure, **edge.kwargs, disable_log_stats=False))


def test_ngram_reaches_vllm_and_keeps_the_greedy_tokens(arms):
    off_kwargs, off_tokens, off_counts, _ = arms["off"]
    on_kwargs, on_tokens, _, _ = arms["ngram"]
    assert "speculative_config" not in off_kwargs
    assert on_kwargs["speculative_config"] == speculative.NGRAM
    assert off_counts is None  # no speculation, no counters
    assert len(off_tokens) >= MAX_TOKENS // 2  # the paragraph, not an early stop
    assert on_tokens == off_tokens


def test_proposals_were_checked_and_kept(arms):
    tokens, counts = arms["ngram"][1:3]
    assert counts["drafts"] > 0 and counts["draft_tokens"] >= counts["drafts"]
    # a verbatim copy is what the lookup finds: a quarter of the answer is a loose floor (every
    # kept proposal is a token the engine produced without a step of its own)
    assert counts["accepted_tokens"] >= len(tokens) // 4, counts
    assert counts["accepted_tokens"] <= counts["draft_tokens"]


def test_bench_grounded_measures_each_arm_on_the_engine(arms):
    """The benchmark's own path: rates from real answers, vLLM's counters only where it
    speculates, and the copying answer the same in both arms (as the test above finds)."""
    off, on = arms["off"][3], arms["ngram"][3]
    assert off["spec_decode"] is None
    assert on["spec_decode"]["draft_tokens"] > 0 and on["spec_decode"]["accepted_tokens"] > 0
    for m in (off, on):
        assert m["grounded_tps"] > 0 and m["chat_tps"] > 0 and m["batch_tps"] > 0
        assert [a["category"] for a in m["answers"]] == ["rewrite", "chat"]
        assert m["answers"][0]["tokens"] == 24  # the paragraph is longer than the cap
    assert on["answers"][0]["digest"] == off["answers"][0]["digest"]
