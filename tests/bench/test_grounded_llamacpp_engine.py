"""bench grounded's llama.cpp arms on the default model's GGUF (needs llama-cpp-python): plain
and prompt lookup decode the same token ids through llama-cpp-python's own loop, and the
lookup's answers are its own greedy ones."""

from __future__ import annotations

import pytest

from support.llamacpp import default_gguf, need_llama_cpp
from vllm_edge.bench import grounded

pytestmark = pytest.mark.slow

# a copying prompt (its answer is longer than the cap) and a chat one
PROMPTS = (grounded.PROMPTS[4], grounded.PROMPTS[12])
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def arms(default_model_dir):
    need_llama_cpp()
    from transformers import AutoTokenizer

    from vllm_edge.bench.engines.llamacpp_lookup import LlamaCppGenerator

    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    out = {}
    for lookup in (False, True):
        gen = LlamaCppGenerator(default_gguf(), lookup=lookup)
        try:
            out[lookup] = (gen.settings(), grounded.measure_llamacpp(gen, tok, max_tokens=MAX_TOKENS,
                                                                     prompts=PROMPTS),
                           gen.answer(grounded.chat_ids(tok, PROMPTS[:1])[0], MAX_TOKENS))
        finally:
            gen.close()
    return tok, out


def test_both_arms_measure_real_answers(arms):
    tok, out = arms
    for lookup, (settings, m, _) in out.items():
        assert (settings["method"] == "off") != lookup
        assert m["grounded_tps"] > 0 and m["chat_tps"] > 0 and m["batch_tps"] is None
        assert [a["category"] for a in m["answers"]] == ["rewrite", "chat"]
        assert m["answers"][0]["tokens"] == MAX_TOKENS  # the message is longer than the cap


def test_the_rewrite_copies_its_message(arms):
    tok, out = arms
    for _, _, answer in out.values():
        text = tok.decode(answer).lower()
        assert "server upgrade" in text, text


def test_a_model_without_a_gguf_is_refused_for_the_llamacpp_arms(tmp_path):
    from vllm_edge.common.errors import UsageError

    with pytest.raises(UsageError, match="need a GGUF file or an embedded model"):
        grounded.model_gguf(str(tmp_path))
