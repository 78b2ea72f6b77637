from __future__ import annotations

import json

import pytest

from vllm_edge.bench import prompts


def test_twelve_prompts_of_three_kinds():
    ps = prompts.fidelity_prompts()
    assert len(ps) == 12 and len({p["id"] for p in ps}) == 12
    assert [p["kind"] for p in ps].count("chat") == 4
    assert [p["kind"] for p in ps].count("long") == 4
    tools = [p for p in ps if p["kind"] == "tool"]
    assert len(tools) == 4
    for p in tools:
        assert p["tools"] and all(t["type"] == "function" and "parameters" in t["function"] for t in p["tools"])
        assert "get_weather" in p["messages"][0]["content"]  # the model sees them whatever the template


def test_prompts_are_deterministic():
    assert json.dumps(prompts.fidelity_prompts()) == json.dumps(prompts.fidelity_prompts())


def test_long_prompts_have_at_least_1500_words():
    for p in prompts.fidelity_prompts():
        if p["kind"] == "long":
            assert len(p["messages"][-1]["content"].split()) >= 1500, p["id"]


def test_long_prompts_exceed_1500_tokens_with_a_real_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    for p in prompts.fidelity_prompts():
        if p["kind"] == "long":
            assert len(tok.encode(p["messages"][-1]["content"])) > 1500, p["id"]


def test_corpus_chunks_and_scored_range():
    chunks = prompts.corpus_chunks(lambda s: [ord(c) for c in s], chunk_len=1000, max_chunks=5)
    assert len(chunks) == 5 and all(len(c) == 1000 for c in chunks)
    assert "".join(map(chr, chunks[0])) == prompts.corpus_text()[:1000]
    all_chunks = prompts.corpus_chunks(lambda s: s.split(), chunk_len=512)
    assert len(all_chunks) == len(prompts.corpus_text().split()) // 512
    r = prompts.scored_range(512)
    assert r.start == 256 and r.stop == 511 and len(r) == 255
    cid = prompts.corpus_id()
    assert cid["source"] == "pydoc_data.topics" and len(cid["sha256"]) == 64


def test_a_selection_keeps_the_named_prompts_in_their_order_and_refuses_unknown_ids():
    picked = prompts.select_fidelity_prompts(("tool-weather", "chat-capital"))
    assert [p["id"] for p in picked] == ["chat-capital", "tool-weather"]
    assert len(prompts.select_fidelity_prompts(None)) == 12
    with pytest.raises(ValueError, match=r"\['chat-nope'\]; known: chat-capital"):
        prompts.select_fidelity_prompts(("chat-capital", "chat-nope"))
    with pytest.raises(ValueError, match="none given"):
        prompts.select_fidelity_prompts(())
