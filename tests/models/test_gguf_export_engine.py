"""GGUF export in llama.cpp itself (needs llama-cpp-python): the export loads and behaves like
the source directory, llama.cpp's quantizer takes it, and the Q/K permutation is load-bearing."""

from __future__ import annotations

import pytest

from support.llamacpp import need_llama_cpp
from vllm_edge.models.gguf_export import export_gguf, iter_metadata, quantize, quantized_path

pytestmark = pytest.mark.slow

PARIS = [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def hf_ref(default_model_dir):
    from vllm_edge.bench.fidelity.hf_reference import HfRunner

    return HfRunner(default_model_dir, dtype="bfloat16")


@pytest.fixture(scope="module")
def hf_greedy(hf_ref):
    """transformers' greedy tokens on the bf16 directory, computed once: {name: (prompt, tokens)}."""
    from vllm_edge.bench.prompts import fidelity_prompts

    msgs = {"paris": PARIS}
    msgs.update({p["id"]: p["messages"] for p in fidelity_prompts() if p["id"] in ("chat-explain", "chat-code")})
    out = {}
    for name, m in msgs.items():
        ids = hf_ref.chat_ids(m)
        out[name] = (ids, hf_ref.greedy(ids, 16, hf_ref.eos_id))
    return out


@pytest.mark.parametrize("out_type", ["bf16", "f16"])
def test_roundtrip_in_llama_cpp(out_type, exported_bf16, hf_ref, hf_greedy, tmp_path):
    """Our GGUF answers the Paris question in llama.cpp, and its greedy tokens match
    transformers on the same bf16 directory for the first 16 tokens."""
    need_llama_cpp()
    from vllm_edge.bench.engines.llamacpp import runner

    path = exported_bf16 if out_type == "bf16" else export_gguf(
        hf_ref.path, tmp_path / "smol.f16.gguf", out_type="f16", progress=False)
    with runner(path, n_ctx=256) as r:
        paris, _ = hf_greedy["paris"]
        answer = hf_ref.tokenizer.decode(r.greedy(paris, 16, hf_ref.eos_id))
        assert "Paris" in answer, answer
        for name, (ids, ref) in hf_greedy.items():
            assert r.greedy(ids, 16, hf_ref.eos_id) == ref, name


def test_llama_cpp_quantize(exported_bf16):
    need_llama_cpp()
    from vllm_edge.bench.engines.llamacpp import quantization_types

    out = quantize(exported_bf16, quantized_path(exported_bf16, "Q8_0"), "Q8_0")
    assert out.name == "smol.bf16.Q8_0.gguf"
    assert "Q8_0" in quantization_types(out)
    assert dict(iter_metadata(out))["general.file_type"] == 7  # MOSTLY_Q8_0
    assert out.stat().st_size < exported_bf16.stat().st_size * 0.6


def test_without_the_rope_permutation_llama_cpp_answers_differently(hf_ref, hf_greedy, tmp_path, monkeypatch):
    """The Q/K permutation is load-bearing: skip it and llama.cpp's rope no longer matches."""
    need_llama_cpp()
    from vllm_edge.bench.engines.llamacpp import runner
    from vllm_edge.models import gguf_export

    monkeypatch.setattr(gguf_export, "rope_interleave", lambda w, n_head: w)
    path = gguf_export.export_gguf(hf_ref.path, tmp_path / "unpermuted.gguf", progress=False)
    paris, ref = hf_greedy["paris"]
    with runner(path, n_ctx=256) as r:
        assert r.greedy(paris, 16, hf_ref.eos_id) != ref
