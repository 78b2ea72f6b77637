"""`vllm-edge quantize` on a tiny synthetic Llama: config, untied head, report, atomicity."""

from __future__ import annotations

import json

import pytest
import torch

from support.checkpoints import no_partial_output, tiny_llama_dir
from vllm_edge.quant import pack
from vllm_edge.quant.quantize import REPORT_NAME, quantize_model


@pytest.fixture
def tiny_llama(tmp_path):
    return tiny_llama_dir(tmp_path / "tiny")


@pytest.mark.parametrize("group", [64, 32])
def test_quantize_writes_cpu_int4_checkpoint(tiny_llama, tmp_path, group):
    from safetensors import safe_open

    dst = quantize_model(tiny_llama, tmp_path / "q", group=group, progress=False)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "cpu_int4"
    assert cfg["quantization_config"]["group_size"] == group
    assert cfg["tie_word_embeddings"] is False
    assert (dst / "tokenizer.json").exists()
    with safe_open(str(dst / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        head = {s: f.get_tensor(f"lm_head.{s}") for s in ("weight_packed", "weight_scale", "weight_zero")}
        emb = f.get_tensor("model.embed_tokens.weight_packed")
        down_scale = f.get_tensor("model.layers.0.mlp.down_proj.weight_scale")
    assert down_scale.shape == (128, 256 // group)
    assert "lm_head.weight" not in names and "model.layers.0.self_attn.q_proj.weight" not in names
    assert "model.norm.weight" in names
    assert head["weight_packed"].shape == (512, 64) and head["weight_packed"].dtype == torch.uint8
    assert torch.equal(head["weight_packed"], emb)  # the untied head is the embedding, quantized
    report = json.loads((dst / REPORT_NAME).read_text())
    assert report["head_untied"] is True
    by_name = {r["name"]: r for r in report["tensors"]}
    # 4 bits + a bf16 scale and a bf16 zero per group
    assert by_name["lm_head.weight"]["bits_per_weight"] == pytest.approx(4 + 32 / group)
    assert all(r["snr_db"] > 15 for r in report["tensors"])


def test_failed_quantize_leaves_no_partial_output(tiny_llama, tmp_path, disk_full):
    with pytest.raises(RuntimeError, match="disk full"):
        quantize_model(tiny_llama, tmp_path / "q", progress=False)
    assert no_partial_output(tmp_path / "q")


def test_bad_scheme_and_group():
    with pytest.raises(ValueError, match="awq"):
        quantize_model("x", "y", scheme="awq")
    with pytest.raises(ValueError, match=r"group 96 is not supported; use one of \(32, 64, 128\)"):
        quantize_model("x", "y", group=96)


@pytest.mark.parametrize("quantize_embedding", [True, False])
def test_tied_table_is_quantized_once_and_written_under_both_names(tiny_llama, tmp_path,
                                                                    monkeypatch, quantize_embedding):
    from safetensors import safe_open

    with safe_open(str(tiny_llama / "model.safetensors"), framework="pt") as f:
        table = f.get_tensor("model.embed_tokens.weight")
    real = pack.quantize
    inputs = []

    def counting(w, *a, **k):  # still the real quantizer
        inputs.append(w.clone())
        return real(w, *a, **k)

    monkeypatch.setattr(pack, "quantize", counting)
    dst = quantize_model(tiny_llama, tmp_path / "q", group=32, progress=False,
                         quantize_embedding=quantize_embedding)
    # 7 linears + the table once, whether it is written under one name or two
    assert len(inputs) == 8
    assert sum(torch.equal(w, table) for w in inputs) == 1

    q, scale, zero = real(table, 32)
    expect = {"weight_packed": pack.pack_nibbles(q), "weight_scale": scale, "weight_zero": zero}
    with safe_open(str(dst / "model.safetensors"), framework="pt") as f:
        head = {s: f.get_tensor(f"lm_head.{s}") for s in expect}
        if quantize_embedding:
            emb = {s: f.get_tensor(f"model.embed_tokens.{s}") for s in expect}
        else:
            assert torch.equal(f.get_tensor("model.embed_tokens.weight"), table)
    for s, v in expect.items():
        assert torch.equal(head[s], v), s
        if quantize_embedding:
            assert torch.equal(emb[s], v), s
    rows = {r["name"]: r for r in json.loads((dst / REPORT_NAME).read_text())["tensors"]}
    assert rows["lm_head.weight"]["tied_head_copy"] is True
    if quantize_embedding:
        e, h = rows["model.embed_tokens.weight"], rows["lm_head.weight"]
        assert (e["snr_db"], e["bits_per_weight"]) == (h["snr_db"], h["bits_per_weight"])
        assert e["tied_head_copy"] is False
    else:
        assert "model.embed_tokens.weight" not in rows


def test_a_link_out_of_the_source_is_refused_naming_it(tiny_llama, tmp_path):
    """quantize copied SRC's extra files following links: notes.txt -> a secret landed in
    the build."""
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE KEY")
    (tiny_llama / "notes.txt").symlink_to(secret)
    with pytest.raises(ValueError, match=r"notes\.txt: is a symbolic link to .*outside the source"):
        quantize_model(tiny_llama, tmp_path / "q", progress=False)
    assert not (tmp_path / "q").exists()


def test_links_inside_the_source_and_a_hub_snapshot_are_kept(tmp_path):
    """A Hugging Face cache snapshot links every file to ../../blobs: that is its own folder."""
    from vllm_edge.quant.quantize import check_links

    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "sha").write_text("{}")
    (snap / "config.json").symlink_to("../../blobs/sha")
    (snap / "inner.txt").write_text("x")
    (snap / "alias.txt").symlink_to("inner.txt")
    check_links(snap)
    (snap / "escape").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="escape"):
        check_links(snap)
