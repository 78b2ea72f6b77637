"""Batched greedy decoding through llama.cpp's C API decodes real sequences: on the BF16 GGUF
export of the default model, every sequence of a batch gets the tokens the one-sequence path
gives its prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_edge.bench.engines.llamacpp import SKIP_REASON

TOKENS = 16
SEQS = 8
PROMPT_LEN = 16
# A flip between two candidates whose reference logits are this close is a near-tie that a
# different matmul shape may break either way; garbage decoding is nowhere near the top.
TIE_TOL = 0.05

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bf16_gguf(default_model_dir, tmp_path_factory) -> Path:
    """The BF16 export `vllm-edge compare` makes, from its cache or exported here."""
    from vllm_edge.bench import compare
    from vllm_edge.models.gguf_export import export_gguf

    cached = compare.builds("default")["llamacpp-BF16"]
    if cached.exists():
        return cached
    return Path(export_gguf(default_model_dir, tmp_path_factory.mktemp("gguf") / cached.name, progress=False))


@pytest.fixture(scope="module")
def runner(bf16_gguf):
    pytest.importorskip("llama_cpp", reason=SKIP_REASON)
    from vllm_edge.bench.engines.llamacpp import LlamaCppRunner

    r = LlamaCppRunner(bf16_gguf, n_ctx=PROMPT_LEN + TOKENS, threads=1, all_logits=True, max_seqs=SEQS)
    yield r
    r.close()


@pytest.fixture(scope="module")
def prompts(runner) -> list[list[int]]:
    from vllm_edge.bench import prompts as corpus
    from vllm_edge.bench.speed import TokenSource

    src = TokenSource(runner.llm.tokenize(corpus.corpus_text().encode(), add_bos=False))
    return [src.take(PROMPT_LEN) for _ in range(SEQS)]


def test_identical_prompts_decode_like_one_sequence(runner, prompts):
    single = runner.greedy(prompts[0], TOKENS)
    batched = runner.greedy_batch([prompts[0]] * SEQS, TOKENS)
    assert len(batched) == SEQS
    for s, out in enumerate(batched):
        assert out == single, f"sequence {s}: {out} != {single}"


def test_distinct_prompts_each_decode_their_own_sequence(runner, prompts):
    # Identical prompts cannot tell whether sequences attend to each other's cache (duplicated
    # keys leave attention unchanged); distinct ones can.
    batched = runner.greedy_batch(prompts, TOKENS)
    exact = 0
    for s, (p, out) in enumerate(zip(prompts, batched)):
        single = runner.greedy(p, TOKENS)
        k = next((i for i, (a, b) in enumerate(zip(single, out)) if a != b), None)
        if k is None:
            exact += 1
            continue
        # Same prefix up to k; there both choices must be at the top of the reference logits.
        ref = runner.logits(p + single[:k])[-1]
        top = float(ref.max())
        for who, tok in (("single", single[k]), ("batched", out[k])):
            assert top - ref[tok] < TIE_TOL, (
                f"sequence {s} diverges at token {k}: {who} chose {tok} at logit {ref[tok]:.4f}, "
                f"{top - ref[tok]:.4f} below the top; single {single}, batched {out}")
    assert exact >= 1


def test_the_batch_context_holds_its_sequences_and_no_more(runner, prompts):
    desc = runner.batch.describe()
    assert desc["n_seq_max"] == SEQS and desc["n_ctx_seq"] >= PROMPT_LEN + TOKENS
    with pytest.raises(ValueError, match=f"{SEQS + 1} sequences: this context holds 1 to {SEQS}"):
        runner.greedy_batch([prompts[0]] * (SEQS + 1), 2)
    with pytest.raises(ValueError, match="do not fit n_ctx_seq"):
        runner.greedy_batch([prompts[0]] * 2, desc["n_ctx_seq"])
    # A shorter batch after a longer one starts from an empty cache.
    assert runner.greedy_batch(prompts[:2], 3) == [o[:3] for o in runner.greedy_batch(prompts[:2], 5)]


def test_too_many_sequences_for_llama_cpp_is_refused(bf16_gguf):
    pytest.importorskip("llama_cpp", reason=SKIP_REASON)
    from vllm_edge.bench.engines.llamacpp import LlamaCppRunner, max_parallel_sequences

    limit = max_parallel_sequences()
    with pytest.raises(ValueError, match=f"{limit + 1} sequences at once: llama.cpp takes 1 to {limit}"):
        LlamaCppRunner(bf16_gguf, n_ctx=32, threads=1, max_seqs=limit + 1)


def test_constrained_decoding_follows_the_schema_and_differs_from_free(runner, prompts):
    """Under the long-text schema every token is inside the JSON the grammar allows: the text
    opens the object and its one string, and a prompt that decodes freely into other text is
    pulled into the schema instead."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from vllm_edge.bench.speed import LONG_TEXT_SCHEMA

    grammar = json_schema_to_gbnf(json.dumps(LONG_TEXT_SCHEMA))
    out = runner.greedy_constrained(prompts[0], TOKENS, grammar)
    text = runner.llm.detokenize(out).decode(errors="replace")
    assert len(out) == TOKENS and text.lstrip().startswith('{'), text
    assert json.loads(text.lstrip()[: text.lstrip().index(":") + 1] + ' ""}') == {"text": ""}
    free = runner.greedy(prompts[0], TOKENS)
    assert free != out
    with pytest.raises(ValueError, match="rejected the grammar"):
        runner.greedy_constrained(prompts[0], 2, "root ::= (")
