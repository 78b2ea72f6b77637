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
    for arch in ff.FROM_LLAMA:
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
    with pytest.raises(ff.FamilyFileError, match="the families made here are qwen2, qwen3, phi3, gemma2"):
        ff.parse_families("qwen2,mamba")
    with pytest.raises(ff.FamilyFileError, match="the families rewritten from a llama file are qwen2, qwen3, phi3"):
        ff.rewrite(_bf16_llama(tmp_path / "l.gguf"), tmp_path / "g.gguf", "gemma2")
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
    for arch in ff.FROM_LLAMA:
        q = quantize(ff.rewrite(src, tmp_path / f"{arch}.gguf", arch), tmp_path / f"{arch}.Q4_K_M.gguf", "Q4_K_M")
        r = gguf.GGUFReader(str(q))
        types = {t.name: t.tensor_type.name for t in r.tensors}
        assert r.get_field("general.architecture").contents() == arch
        ffn_down = "blk.0.ffn_down.weight"
        assert types[ffn_down] == "Q6_K"  # llama.cpp's Q4_K_M mixture, not a plain Q4_K file
        assert "Q4_K" in types.values()
        assert gguf_import.inspect_gguf(q).architecture == arch


def _tiny_gemma3(path):
    return tiny_llama_gguf(path, hidden=256, ffn=512, arch="gemma3", head_dim=64,
                           types={f"{m}.weight": "BF16" for m in MATRICES})


def test_gemma2_holds_gemma3s_weights_with_its_qk_norms_folded(tmp_path):
    """Every Gemma 3 tensor kept (BF16 of gguf's dequantization), the q/k norms gone into
    attn_q/attn_k as row scales (norm weight times the head's scale), Gemma 2's soft-caps and
    one rope base written, and the file ours and a gemma2 to our import."""
    src = _tiny_gemma3(tmp_path / "g3.gguf")
    r3, base = _tensors(src)
    heads, kv_heads, head = 4, 2, 64
    q_scale = np.array([[0.5, 1.0, 2.0, 4.0]], np.float32)
    k_scale = np.array([[3.0, 0.25]], np.float32)
    out = ff.gemma2_from_gemma3(src, tmp_path / "g2.gguf", scales=(q_scale, k_scale))
    r, got = _tensors(out)
    assert r.get_field("general.architecture").contents() == "gemma2"
    assert not any(k.startswith("gemma3.") for k in r.fields)
    assert r.get_field("gemma2.attention.key_length").contents() == head
    assert r.get_field("gemma2.attn_logit_softcapping").contents() == ff.GEMMA2_SOFTCAPS[0]
    assert r.get_field("gemma2.final_logit_softcapping").contents() == ff.GEMMA2_SOFTCAPS[1]
    assert r.get_field("gemma2.rope.freq_base").contents() == ff.GEMMA2_ROPE_BASE
    assert "blk.0.attn_q_norm.weight" not in got and "blk.0.attn_k_norm.weight" not in got
    for name, t in base.items():
        if "norm" in name and "attn_q_norm" not in name and "attn_k_norm" not in name:
            np.testing.assert_array_equal(got[name], t)  # F32 norms, 1 + w as stored
    for name in ("token_embd.weight", "blk.0.attn_v.weight", "blk.0.ffn_up.weight"):
        np.testing.assert_array_equal(got[name], base[name])  # BF16 in, BF16 out
    for kind, n, scale in (("attn_q", heads, q_scale[0]), ("attn_k", kv_heads, k_scale[0])):
        norm = base[f"blk.0.{kind}_norm.weight"]
        want = base[f"blk.0.{kind}.weight"] * (norm[None, :] * scale[:, None]).reshape(n * head, 1)
        np.testing.assert_allclose(got[f"blk.0.{kind}.weight"], want, rtol=2 ** -8)  # one bf16 rounding
        assert not np.allclose(got[f"blk.0.{kind}.weight"], base[f"blk.0.{kind}.weight"], rtol=0.05)
    assert gguf_import.inspect_gguf(out).architecture == "gemma2"
    from vllm_edge.models.gguf_export import written_by_us

    assert written_by_us(out)  # make() may replace it; a file of the user's it refuses


def test_gemma2_is_made_from_a_gemma3_file_only(tmp_path):
    scales = (np.ones((1, 4), np.float32), np.ones((1, 2), np.float32))
    with pytest.raises(ff.FamilyFileError, match="l.gguf: general.architecture is 'llama'; gemma2 is made from a gemma3"):
        ff.gemma2_from_gemma3(_bf16_llama(tmp_path / "l.gguf"), tmp_path / "o.gguf", scales=scales)
    with pytest.raises(ff.FamilyFileError, match="q/k scales of shape"):
        ff.gemma2_from_gemma3(_tiny_gemma3(tmp_path / "g3.gguf"), tmp_path / "o.gguf",
                              scales=(np.ones((1, 3), np.float32), scales[1]))
    assert not (tmp_path / "o.gguf").exists()
