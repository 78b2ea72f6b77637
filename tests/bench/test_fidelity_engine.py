"""Fidelity on the real engine: a build scored against its own saved reference is perfect.

One eager engine on the default bf16 model serves both collections; a small subset
(2 chat prompts, 16 greedy tokens, 2 corpus chunks of 128 tokens) keeps it short. This is
what proves the plumbing reads vLLM's real greedy outputs and prompt log-probs (including
their container types) the way the fake-engine tests assume.
"""

from __future__ import annotations

import pytest

from vllm_edge.bench import prompts as P
from vllm_edge.bench.fidelity import engine as fidelity
from vllm_edge.bench.fidelity import run as fidelity_cli

pytestmark = pytest.mark.slow

N_PROMPTS, GREEDY, CHUNK, CHUNKS, K = 2, 16, 128, 2, 20


@pytest.fixture(scope="module")
def engine(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    prompt_ids = fidelity.chat_prompt_ids(tok, P.fidelity_prompts()[:N_PROMPTS])
    chunks = P.corpus_chunks(lambda s: tok.encode(s, add_special_tokens=False), CHUNK, CHUNKS)
    mml = fidelity_cli.needed_len(prompt_ids, chunks, GREEDY)
    llm, edge = fidelity_cli._engine(default_model_dir, mml, K, "bfloat16", enforce_eager=True)
    yield llm, edge, prompt_ids, chunks
    del llm


def test_a_build_against_itself_scores_perfect(engine, tmp_path):
    llm, edge, prompt_ids, chunks = engine
    assert edge.kwargs["enable_prefix_caching"] is False  # a cached prefix returns no prompt log-probs
    ref_data = fidelity.collect(llm, None, k=K, greedy_tokens=GREEDY, prompt_ids=prompt_ids, chunks=chunks)
    assert len(ref_data["greedy"]) == N_PROMPTS and all(len(g) > 0 for g in ref_data["greedy"])
    assert len(ref_data["positions"]) == CHUNKS * len(P.scored_range(CHUNK))
    assert all(len(d) >= K for d in ref_data["positions"])

    ref = fidelity.load_reference(fidelity.save_reference(tmp_path / "ref", ref_data,
                                                          meta={"greedy_tokens": GREEDY}))
    cand = fidelity.collect(llm, None, k=ref["k"], greedy_tokens=GREEDY,
                            prompt_ids=ref["prompt_ids"], chunks=ref["chunks"])
    scored = fidelity.score(ref, cand)
    g, tf = scored["greedy"], scored["teacher_forced"]
    assert g["exact_matches"] == N_PROMPTS and g["kept_fraction"] == 1.0
    assert g["first_token_agreement"] == 1.0
    assert tf["positions"] == CHUNKS * len(P.scored_range(CHUNK))
    assert tf["top1_agreement"] == 1.0
    assert tf["coverage"] == pytest.approx(1.0)
    assert tf["kl_mean"] < 1e-6 and tf["kl_max"] < 1e-4
    assert abs(tf["delta_logprob"]) < 1e-6
    # and the same metrics see a real difference: a shifted corpus token must not score perfect
    shifted = dict(cand, target_lp=[x - 1.0 for x in cand["target_lp"]])
    assert fidelity.score(ref, shifted)["teacher_forced"]["delta_logprob"] == pytest.approx(-1.0)
