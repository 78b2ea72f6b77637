"""N-gram speculative decoding through vLLM's own speculative_config, on the default model's
cpu_int4 build: greedy tokens equal plain decoding's on a prompt whose answer copies its input,
and vLLM's counters show the proposals were checked and kept. One eager engine per arm."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import attention_split, speculative
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
    from vllm import SamplingParams, envs

    assert envs.VLLM_CPU_ATTN_SPLIT_KV is False  # the engine read the edge environment

    out = llm.chat([{"role": "user", "content": PROMPT}],
                   SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), spec_decode_counts(llm.get_metrics())


def _answer_and_measure(llm):
    from vllm_edge.bench import grounded

    return (*_answer(llm), grounded.measure(llm, llm.get_tokenizer(), reps=1, max_tokens=24,
                                            prompts=GROUNDED))


@pytest.fixture(scope="module")
def arms(default_int4_dir, run_llm):
    # vLLM's attention splits a lone query row's keys between the threads, never a tile of
    # several rows, so with the split a one-row step and a verification step round differently;
    # the edge engine turns it off where each thread keeps a KV head (runtime/attention_split.py):
    # the default model's 3 on up to 3 threads. The claim under test is the split-off one.
    out = {}
    env = edge_engine(default_int4_dir, max_model_len=512, enforce_eager=True).env
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(attention_split.ENV, env.get(attention_split.ENV, "0"))
        _both(out, default_int4_dir, run_llm)
    return out


def _both(out, default_int4_dir, run_llm):
    for method in speculative.METHODS:
        # auto's batch schedule needs room for two requests; both prompts prefill in one step
        # (and asks it three times: no prefix cache, so each answer's prefill is the first one's)
        seqs, batched = (2, 512) if method == "auto" else (1, 128)
        edge = edge_engine(default_int4_dir, max_model_len=512, max_num_seqs=seqs, enforce_eager=True,
                           max_num_batched_tokens=batched, speculative=method,
                           enable_prefix_caching=method != "auto")
        if method == "auto":
            out[method] = (edge.kwargs, run_llm(_auto_arm, **edge.kwargs, disable_log_stats=False))
        else:
            out[method] = (edge.kwargs, *run_llm(_answer_and_measure, **edge.kwargs, disable_log_stats=False))


def _gate():
    from vllm_edge.runtime import speculative_gate

    return dict(speculative_gate.report())


def _delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}


def _auto_arm(llm):
    """auto's three cases on one engine: alone (proposals checked), two at once (none, by vLLM's
    batch schedule), and alone with the gate's bar out of reach (every proposal held back)."""
    from vllm import SamplingParams

    from vllm_edge.runtime import speculative_gate

    g0 = _gate()
    tokens, alone = _answer(llm)
    g1 = _gate()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    before = spec_decode_counts(llm.get_metrics())
    pair = llm.chat([[{"role": "user", "content": PROMPT}]] * 2, params, use_tqdm=False)
    two = _delta(spec_decode_counts(llm.get_metrics()), before)
    g2 = _gate()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speculative_gate, "THRESHOLD", speculative.NGRAM["num_speculative_tokens"] + 1)
        before = spec_decode_counts(llm.get_metrics())
        held_tokens, _ = _answer(llm)
        held = _delta(spec_decode_counts(llm.get_metrics()), before)
    g3 = _gate()
    return {"tokens": tokens, "alone": alone, "gate_alone": _delta(g1, g0),
            "pair_tokens": [list(o.outputs[0].token_ids) for o in pair], "two": two,
            "gate_two": _delta(g2, g1), "held_tokens": held_tokens, "held": held,
            "gate_held": _delta(g3, g2), "state": g3["state"]}


def test_ngram_reaches_vllm_and_keeps_the_greedy_tokens(arms):
    off_kwargs, off_tokens, off_counts, _ = arms["off"]
    on_kwargs, on_tokens, _, _ = arms["ngram"]
    assert "speculative_config" not in off_kwargs
    assert on_kwargs["speculative_config"] == speculative.NGRAM
    assert off_counts is None  # no speculation, no counters
    assert len(off_tokens) >= MAX_TOKENS // 2  # the paragraph, not an early stop
    assert on_tokens == off_tokens


def test_auto_speculates_alone_keeps_the_tokens_and_stops_for_two(arms):
    kwargs, auto = arms["auto"][0], arms["auto"][1]
    off_tokens = arms["off"][1]
    assert kwargs["speculative_config"] == speculative.engine_config("auto")
    assert auto["state"] == "applied"
    assert auto["tokens"] == off_tokens
    # alone: the copy's proposals pass the gate and vLLM checks them; the gate passes one more
    # than vLLM counts per request (the proposal made at the answer's last step is never checked)
    alone, gate = auto["alone"], auto["gate_alone"]
    assert alone["drafts"] > 0 and alone["accepted_tokens"] >= len(off_tokens) // 4, alone
    assert gate["withheld"] == 0 and alone["drafts"] <= gate["submitted"] <= alone["drafts"] + 1, gate
    # two at once: vLLM's batch schedule asks for no proposal, so nothing is checked
    assert auto["two"]["drafts"] == 0 and auto["two"]["draft_tokens"] == 0, auto["two"]
    assert auto["pair_tokens"] == [off_tokens, off_tokens]


def test_proposals_the_gate_holds_back_are_not_checked(arms):
    """With the bar above any proposal's length, every proposal is held back: vLLM checks none,
    and the answer is the plain one."""
    auto = arms["auto"][1]
    assert auto["gate_held"]["withheld"] > 0 and auto["gate_held"]["submitted"] == 0, auto["gate_held"]
    assert auto["held"]["drafts"] == 0, auto["held"]
    assert auto["held_tokens"] == arms["off"][1]


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
