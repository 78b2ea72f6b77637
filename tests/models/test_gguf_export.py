"""GGUF export: metadata and tokenizer survive, Q/K rows are in llama.cpp's rope layout,
outputs are atomic, and (with llama.cpp) the export loads and behaves like the source dir."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vllm_edge.models import store
from vllm_edge.models.gguf_export import (
    GgufExportError,
    export_gguf,
    iter_metadata,
    quantize,
    quantized_path,
    rope_interleave,
)

LLAMA_CPP_REASON = "llama-cpp-python is not installed (pip install 'vllm-edge[baselines]')"


def _rotate_half_rope(x, pos, theta=10000.0):
    """HF Llama: pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _interleaved_rope(x, pos, theta=10000.0):
    """llama.cpp LLAMA (normal) mode: pairs (2i, 2i + 1)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos * inv
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * ang.cos() - b * ang.sin()
    out[..., 1::2] = a * ang.sin() + b * ang.cos()
    return out


def test_rope_interleave_makes_llama_cpp_rope_equal_hf_rope():
    n_head, d, hidden = 3, 8, 5
    w = torch.randn(n_head * d, hidden, dtype=torch.float64)
    x = torch.randn(hidden, dtype=torch.float64)
    wp = rope_interleave(w, n_head)
    for pos in (0, 1, 7):
        hf = _rotate_half_rope((w @ x).view(n_head, d), pos)
        cpp = _interleaved_rope((wp @ x).view(n_head, d), pos)
        # Same rotation, rows reordered: q.k dot products (attention scores) are identical.
        assert torch.allclose(rope_interleave(hf.reshape(-1, 1), n_head).view(n_head, d), cpp)
        assert not torch.allclose(_interleaved_rope((w @ x).view(n_head, d), pos), cpp)


@pytest.fixture(scope="module")
def exported_bf16(default_model_dir, tmp_path_factory):
    return export_gguf(default_model_dir, tmp_path_factory.mktemp("export") / "smol.bf16.gguf", progress=False)


def test_export_keeps_metadata_and_tokenizer(exported_bf16):
    src = dict(iter_metadata(store.source_gguf(store.resolve_key("default"))))
    got = dict(iter_metadata(exported_bf16))
    same = ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]
    same += [k for k in src if k.startswith("llama.")]
    for k in same:
        assert got[k] == src[k], k
    assert got["general.file_type"] == 32  # MOSTLY_BF16
    # The imported tokenizer.json has plain ByteLevel (transformers drops the digit split of
    # "smollm"); the export says what the directory really does.
    assert got["tokenizer.ggml.pre"] == "gpt-2"


def test_exported_tensors_are_in_llama_cpp_layout(exported_bf16):
    """attn_q/attn_k of the source GGUF are in llama.cpp's rope layout; ours must match them."""
    import gguf

    src = {t.name: t for t in gguf.GGUFReader(str(store.source_gguf(store.resolve_key("default")))).tensors}
    ours = {t.name: t for t in gguf.GGUFReader(str(exported_bf16)).tensors}
    assert set(ours) == set(src)  # tied: no output.weight in either
    for name in ("blk.0.attn_q.weight", "blk.7.attn_k.weight", "blk.3.ffn_down.weight"):
        ref = gguf.dequantize(src[name].data, src[name].tensor_type)
        assert ours[name].tensor_type == gguf.GGMLQuantizationType.BF16
        got = gguf.dequantize(ours[name].data, ours[name].tensor_type)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max(), name  # bf16 rounding only


def _tiny_dir(tmp_path, default_model_dir, **cfg_changes):
    d = tmp_path / "m"
    d.mkdir()
    for f in default_model_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, d / f.name)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(cfg_changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_refuses_other_architectures(tmp_path, default_model_dir):
    d = _tiny_dir(tmp_path, default_model_dir, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"])
    out = tmp_path / "x.gguf"
    with pytest.raises(GgufExportError, match="only LlamaForCausalLM"):
        export_gguf(d, out, progress=False)
    assert not out.exists()


def test_missing_tensors_leave_no_file(tmp_path, default_model_dir):
    from safetensors.torch import save_file

    d = _tiny_dir(tmp_path, default_model_dir)
    save_file({"model.embed_tokens.weight": torch.zeros(49152, 576, dtype=torch.bfloat16)},
              str(d / "model.safetensors"))
    out = tmp_path / "x.gguf"
    with pytest.raises(GgufExportError, match="missing tensors"):
        export_gguf(d, out, progress=False)
    assert list(tmp_path.glob("*x.gguf*")) == []


# --- with llama.cpp -------------------------------------------------------------

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


@pytest.mark.slow
@pytest.mark.parametrize("out_type", ["bf16", "f16"])
def test_roundtrip_in_llama_cpp(out_type, exported_bf16, hf_ref, hf_greedy, tmp_path):
    """Our GGUF answers the Paris question in llama.cpp, and its greedy tokens match
    transformers on the same bf16 directory for the first 16 tokens."""
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_REASON)
    from vllm_edge.bench.llamacpp.runner import runner

    path = exported_bf16 if out_type == "bf16" else export_gguf(
        hf_ref.path, tmp_path / "smol.f16.gguf", out_type="f16", progress=False)
    with runner(path, n_ctx=256) as r:
        paris, _ = hf_greedy["paris"]
        answer = hf_ref.tokenizer.decode(r.greedy(paris, 16, hf_ref.eos_id))
        assert "Paris" in answer, answer
        for name, (ids, ref) in hf_greedy.items():
            assert r.greedy(ids, 16, hf_ref.eos_id) == ref, name


@pytest.mark.slow
def test_llama_cpp_quantize(exported_bf16):
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_REASON)
    from vllm_edge.bench.llamacpp.runner import quantization_types

    out = quantize(exported_bf16, quantized_path(exported_bf16, "Q8_0"), "Q8_0")
    assert out.name == "smol.bf16.Q8_0.gguf"
    assert "Q8_0" in quantization_types(out)
    assert dict(iter_metadata(out))["general.file_type"] == 7  # MOSTLY_Q8_0
    assert out.stat().st_size < exported_bf16.stat().st_size * 0.6


@pytest.mark.slow
def test_without_the_rope_permutation_llama_cpp_answers_differently(hf_ref, hf_greedy, tmp_path, monkeypatch):
    """The Q/K permutation is load-bearing: skip it and llama.cpp's rope no longer matches."""
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_REASON)
    from vllm_edge.bench.llamacpp.runner import runner
    from vllm_edge.models import gguf_export

    monkeypatch.setattr(gguf_export, "rope_interleave", lambda w, n_head: w)
    path = gguf_export.export_gguf(hf_ref.path, tmp_path / "unpermuted.gguf", progress=False)
    paris, ref = hf_greedy["paris"]
    with runner(path, n_ctx=256) as r:
        assert r.greedy(paris, 16, hf_ref.eos_id) != ref
