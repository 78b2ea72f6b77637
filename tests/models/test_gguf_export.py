"""GGUF export: metadata and tokenizer survive, Q/K rows are in llama.cpp's rope layout, and
outputs are atomic (the export in llama.cpp itself is in test_gguf_export_engine)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from support.checkpoints import copy_without_weights
from support.llamacpp import default_gguf
from vllm_edge.models.gguf_export import (
    GgufExportError,
    export_gguf,
    iter_metadata,
    rope_interleave,
)


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


def test_export_keeps_metadata_and_tokenizer(exported_bf16):
    src = dict(iter_metadata(default_gguf()))
    got = dict(iter_metadata(exported_bf16))
    same = ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]
    same += [k for k in src if k.startswith("llama.")]
    for k in same:
        assert got[k] == src[k], k
    assert got["general.file_type"] == 32  # MOSTLY_BF16
    # the import keeps the file's digit split ("smollm"), and the export names it again
    assert got["tokenizer.ggml.pre"] == src["tokenizer.ggml.pre"] == "smollm"


def test_exported_tensors_are_in_llama_cpp_layout(exported_bf16):
    """attn_q/attn_k of the source GGUF are in llama.cpp's rope layout; ours must match them."""
    import gguf

    src = {t.name: t for t in gguf.GGUFReader(str(default_gguf())).tensors}
    ours = {t.name: t for t in gguf.GGUFReader(str(exported_bf16)).tensors}
    assert set(ours) == set(src)  # tied: no output.weight in either
    for name in ("blk.0.attn_q.weight", "blk.7.attn_k.weight", "blk.3.ffn_down.weight"):
        ref = gguf.dequantize(src[name].data, src[name].tensor_type)
        assert ours[name].tensor_type == gguf.GGMLQuantizationType.BF16
        got = gguf.dequantize(ours[name].data, ours[name].tensor_type)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max(), name  # bf16 rounding only


def _tiny_dir(tmp_path, default_model_dir, **cfg_changes):
    d = copy_without_weights(default_model_dir, tmp_path / "m")
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
