"""bench.family_files: the default model's weights rewritten as other families' GGUF files, and
llama.cpp's quantizer on them (no engine starts here)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from support.checkpoints import tiny_gguf, tiny_llama_gguf
from support.llamacpp import need_llama_cpp
from vllm_edge.bench import family_files as ff
from vllm_edge.common.atomic import DestinationError
from vllm_edge.models import gguf_import
from vllm_edge.models.gguf_repack import rope_rows

MATRICES = ("token_embd", "blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v", "blk.0.attn_output",
            "blk.0.ffn_gate", "blk.0.ffn_up", "blk.0.ffn_down")


def _bf16_llama(path, hidden=256, ffn=512):
    """A llama file whose matrices are BF16, as the default model's export."""
    return tiny_llama_gguf(path, hidden=hidden, ffn=ffn, types={f"{m}.weight": "BF16" for m in MATRICES})


def _tensors(path):
    r = gguf.GGUFReader(str(path))
    return r, {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in r.tensors}


def test_each_family_holds_the_llama_weights_in_its_own_layout(tmp_path):
    src = _bf16_llama(tmp_path / "l.gguf")
    _, base = _tensors(src)
    q_hf = base["blk.0.attn_q.weight"][rope_rows(256, 4).numpy()]  # 4 heads of 64
    k_hf = base["blk.0.attn_k.weight"][rope_rows(128, 2).numpy()]
    for arch in ff.FAMILIES:
        r, got = _tensors(ff.rewrite(src, tmp_path / f"{arch}.gguf", arch))
        assert r.get_field("general.architecture").contents() == arch
        assert r.get_field(f"{arch}.block_count").contents() == 1
        assert not any(k.startswith("llama.") for k in r.fields)
        np.testing.assert_array_equal(got["token_embd.weight"], base["token_embd.weight"])
        if arch == "phi3":
            np.testing.assert_array_equal(got["blk.0.attn_qkv.weight"], np.concatenate(
                [q_hf, k_hf, base["blk.0.attn_v.weight"]]))
            np.testing.assert_array_equal(got["blk.0.ffn_up.weight"], np.concatenate(
                [base["blk.0.ffn_gate.weight"], base["blk.0.ffn_up.weight"]]))
            assert "blk.0.attn_q.weight" not in got and "blk.0.ffn_gate.weight" not in got
        else:
            np.testing.assert_array_equal(got["blk.0.attn_q.weight"], q_hf)
            np.testing.assert_array_equal(got["blk.0.attn_k.weight"], k_hf)
        assert ("blk.0.attn_q.bias" in got) == (arch == "qwen2")
        if arch == "qwen2":
            assert got["blk.0.attn_k.bias"].shape == (128,) and got["blk.0.attn_k.bias"].std() > 0.05
        if arch == "qwen3":
            np.testing.assert_array_equal(got["blk.0.attn_q_norm.weight"], np.ones(64, np.float32))
            assert r.get_field("qwen3.attention.key_length").contents() == 64
        # our import takes the file as its family
        assert gguf_import.inspect_gguf(tmp_path / f"{arch}.gguf").architecture == arch


def test_bad_sources_and_names_are_refused_by_name(tmp_path):
    with pytest.raises(ff.FamilyFileError, match="q.gguf: general.architecture is 'qwen2'"):
        ff.rewrite(tiny_gguf(tmp_path / "q.gguf", "qwen2"), tmp_path / "o.gguf", "qwen3")
    with pytest.raises(ff.FamilyFileError, match="the families made here are qwen2, qwen3, phi3"):
        ff.parse_families("qwen2,mamba")
    mixed = tiny_llama_gguf(tmp_path / "m.gguf", hidden=64, ffn=128)  # attn_q Q8_0, attn_k F32
    with pytest.raises(ff.FamilyFileError, match="blk.0.attn_q.weight is Q8_0, blk.0.attn_k.weight is F32"):
        ff.rewrite(mixed, tmp_path / "p.gguf", "phi3")
    assert not (tmp_path / "p.gguf").exists() and not list(tmp_path.glob(".p.gguf*partial"))


def test_a_file_we_did_not_make_is_refused_before_any_work(tmp_path):
    theirs = ff.bf16_path("qwen2", tmp_path)
    theirs.write_bytes(b"a user's file")
    with pytest.raises(DestinationError):
        ff.make(("qwen2",), (), out_dir=tmp_path, progress=False)
    assert theirs.read_bytes() == b"a user's file"


def test_llama_cpp_quantizes_each_family_file_with_its_own_mixture(tmp_path):
    need_llama_cpp()
    from vllm_edge.models.gguf_export import quantize

    src = _bf16_llama(tmp_path / "l.gguf")
    for arch in ff.FAMILIES:
        q = quantize(ff.rewrite(src, tmp_path / f"{arch}.gguf", arch), tmp_path / f"{arch}.Q4_K_M.gguf", "Q4_K_M")
        r = gguf.GGUFReader(str(q))
        types = {t.name: t.tensor_type.name for t in r.tensors}
        assert r.get_field("general.architecture").contents() == arch
        ffn_down = "blk.0.ffn_down.weight"
        assert types[ffn_down] == "Q6_K"  # llama.cpp's Q4_K_M mixture, not a plain Q4_K file
        assert "Q4_K" in types.values()
        assert gguf_import.inspect_gguf(q).architecture == arch
