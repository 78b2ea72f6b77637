"""Careless and hostile inputs to the commands that write models: each gets a clear error
naming the file or field, exit 2, and every file it was pointed at is byte-identical after."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vllm_edge.cli import main


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory, default_model_dir) -> Path:
    from vllm_edge.models import synthetic

    out = tmp_path_factory.mktemp("tiny") / "llama"
    return synthetic.build(out, synthetic.Shape.derive(256, 2, 49152), tokenizer_from=default_model_dir,
                           progress=False)


@pytest.fixture
def work(tmp_path, tiny_src) -> Path:
    src = tmp_path / "src"
    shutil.copytree(tiny_src, src)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8\xff\xe0 a cat")
    return tmp_path


def _weights(src: Path) -> Path:
    return sorted(src.glob("*.safetensors"))[0]


def _edit_config(src: Path, **fields) -> None:
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(fields)
    (src / "config.json").write_text(json.dumps(cfg))


CASES = {
    # name: (argv with {src}/{root} placeholders, setup(src), message fragment)
    "quantize into an unrelated folder": (["quantize", "{src}", "{root}/photos"], None,
                                          "photos: exists and is a directory with 1 entries"),
    "quantize onto its source": (["quantize", "{src}", "{src}"], None, "the destination is the input itself"),
    "quantize inside its source": (["quantize", "{src}", "{src}/int4"], None,
                                   "the destination is inside the input directory"),
    "quantize an already-quantized folder": (
        ["quantize", "{src}", "{root}/out"],
        lambda src: _edit_config(src, quantization_config={"quant_method": "cpu_int4", "group_size": 32}),
        "config.json: field quantization_config says the source is already quantized (cpu_int4)"),
    "quantize an unknown architecture": (
        ["quantize", "{src}", "{root}/out"], lambda src: _edit_config(src, architectures=["MambaForCausalLM"]),
        "config.json: field architectures=['MambaForCausalLM'] is not supported"),
    "quantize a garbage config": (
        ["quantize", "{src}", "{root}/out"], lambda src: (src / "config.json").write_text("{not json"),
        "config.json: not valid JSON"),
    "quantize a folder with no config": (
        ["quantize", "{src}", "{root}/out"], lambda src: (src / "config.json").unlink(), "config.json: missing"),
    "quantize a truncated safetensors file": (
        ["quantize", "{src}", "{root}/out"],
        lambda src: _weights(src).write_bytes(_weights(src).read_bytes()[:1000]),
        ".safetensors: not a readable safetensors file"),
    "quantize a garbage safetensors file": (
        ["quantize", "{src}", "{root}/out"],
        lambda src: _weights(src).write_bytes(b"\x00" * 64),
        ".safetensors: not a readable safetensors file"),
    "synthetic over an unrelated folder": (
        ["models", "synthetic", "{root}/photos", "--hidden", "256", "--layers", "2", "--tokenizer-from", "{src}"],
        None, "photos: exists and is a directory with 1 entries"),
    "export-npu over an unrelated folder": (["models", "export-npu", "{src}", "{root}/photos", "--context", "64",
                                             "--prefill", "8"], None,
                                            "photos: exists and is a directory with 1 entries"),
    "export-npu an unknown architecture": (
        ["models", "export-npu", "{src}", "{root}/out"],
        lambda src: _edit_config(src, architectures=["MambaForCausalLM"]), "writes the Llama family only"),
    "run with no answer at a time": (["run", "--num-parallel", "0", "--prompt", "hi"], None,
                                     "--num-parallel 0: must be at least 1"),
    "export-npu with a dynamic context": (["models", "export-npu", "{src}", "{root}/out", "--context", "dynamic"],
                                          None, "dynamic shapes are not supported"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_and_nothing_is_lost(work, capsys, name):
    argv, setup, message = CASES[name]
    src = work / "src"
    if setup:
        setup(src)
    before = _snapshot(work)
    rc = main([a.format(src=src, root=work) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and "Traceback" not in err
    assert _snapshot(work) == before


def test_import_gguf_refuses_the_folder_that_holds_the_gguf(tmp_path, capsys):
    from vllm_edge.models import store

    gguf = tmp_path / "m.gguf"
    shutil.copy(store.source_gguf(store.resolve_key("default")), gguf)
    (tmp_path / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path)
    assert main(["models", "import-gguf", str(gguf), str(tmp_path), "--force"]) == 2
    assert "contains the input" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_a_build_with_a_deleted_weight_file_is_rebuilt(tmp_path, tiny_src, caplog):
    from vllm_edge.common import manifest
    from vllm_edge.quant.quantize import quantize_model

    out = quantize_model(tiny_src, tmp_path / "q", progress=False)
    assert manifest.problem(out) is None
    (out / "model.safetensors").unlink()
    assert "model.safetensors is missing" in manifest.problem(out)  # quantize writes one file
    assert main(["quantize", str(tiny_src), str(out), "--no-progress"]) == 0
    assert manifest.problem(out) is None


@pytest.mark.parametrize("which", ["speech", "folder"])
def test_run_sends_a_speech_model_to_speak(tmp_path, capsys, monkeypatch, which):
    """A talker's tokens are codec frames: `run` refuses it, before any build or server, and
    names the command that speaks."""
    from vllm_edge.models.speech.talker import ARCHITECTURE

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    model = "speech"
    if which == "folder":
        folder = tmp_path / "talker"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": [ARCHITECTURE]}))
        model = str(folder)
    assert main(["run", "--model", model, "--prompt", "hello"]) == 2
    err = capsys.readouterr().err
    assert "speech model" in err and "vllm-edge speak" in err
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.safetensors"))
