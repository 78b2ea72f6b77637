"""The default model's cached builds (`models prepare --quant`) and how `run` reaches them: the
default format at its GGUF's block width is the repack of the file (its own codes), any other
format or group quantizes the bf16 conversion.

A tiny synthetic Llama stands in for the bf16 conversion; nothing here loads vLLM.
"""

from __future__ import annotations

import json

import pytest

from vllm_edge.common import manifest
from vllm_edge.models import child, resolver, store, synthetic


@pytest.fixture
def fake_bf16(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    shape = synthetic.Shape.derive(128, 1, 512, intermediate=256, heads=4, kv_heads=2)
    bf16 = synthetic.build(store.prepared_dir(store.resolve_key("default")), shape,
                           tokenizer_from=tok, progress=False)
    monkeypatch.setattr(store, "prepare", lambda name="default", **k: bf16)
    return bf16


def test_quantizes_once_beside_the_bf16_dir(fake_bf16, monkeypatch):
    from vllm_edge.quant import quantize

    assert not store.quantized_ready("default")
    out = store.prepare_quantized("default", progress=False)
    assert out == fake_bf16.parent / "smollm2-135m-cpu_int4-g32"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "cpu_int4"
    assert cfg["quantization_config"]["group_size"] == 32
    data = manifest.read(out)
    assert data["converter"] == f"{quantize.CONVERTER_VERSION}+{synthetic.CONVERTER_VERSION}"
    assert (data["scheme"], data["group_size"], data["source"]) == ("cpu_int4", 32, str(fake_bf16))
    assert store.quantized_ready("default")
    assert not store.quantized_ready("default", group=128)

    calls = []
    monkeypatch.setattr(quantize, "quantize_model", lambda *a, **k: calls.append(a))
    assert store.prepare_quantized("default", progress=False) == out
    assert calls == []  # cached
    store.prepare_quantized("default", force=True, progress=False)
    assert len(calls) == 1


def test_a_new_source_is_quantized_again(fake_bf16, monkeypatch):
    from vllm_edge.quant import quantize

    store.prepare_quantized("default", progress=False)
    m = fake_bf16 / manifest.NAME
    m.write_text(json.dumps({**json.loads(m.read_text()), "source_sha256": "new"}))
    calls = []
    monkeypatch.setattr(quantize, "quantize_model", lambda *a, **k: calls.append(k["manifest"]))
    store.prepare_quantized("default", progress=False)
    assert calls and calls[0]["source_sha256"] == "new"


def test_run_quantizes_in_a_child_process_only_when_needed(fake_bf16, monkeypatch):
    """The first use builds in a spawned child (a real one: the quantizer runs there, on the
    bf16 directory on disk); a second use finds the build and starts nothing."""
    monkeypatch.setattr(store, "source_gguf", lambda m: "x.gguf")
    target = resolver.ensure_model("default", "cpu_int4", 64)
    assert target == store.quantized_dir(store.resolve_key("default"), "cpu_int4", 64)
    assert store.quantized_ready("default", "cpu_int4", 64) and manifest.problem(target) is None
    assert manifest.read(target)["source"] == str(fake_bf16)

    def no_child(*a, **k):
        raise AssertionError("a cached build must not be prepared again")

    monkeypatch.setattr(child, "run", no_child)
    assert resolver.ensure_model("default", "cpu_int4", 64) == target


def test_the_default_format_runs_the_files_own_codes(tmp_path, monkeypatch):
    """cpu_int4 at group 32 (what `run` picks) is the repack of the package's GGUF, built in a
    child once, and no bf16 conversion or requantization is made for it."""
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    for group in (32, None):
        target = resolver.ensure_model("default", "cpu_int4", group)
        assert target == store.repacked_dir(store.resolve_key("default")) == \
            store.embedded_dir("default", "cpu_int4", group)
    assert [p.name for p in (tmp_path / "home" / "models").iterdir() if not p.name.startswith(".")] \
        == [target.name]  # no bf16 conversion, no requantized build
    report = json.loads((target / "repack_report.json").read_text())
    routes = {t["name"]: t["route"] for t in report["tensors"]}
    assert routes.pop("model.embed_tokens.weight") == "repack8"  # Q8_0, in 8 bits
    assert set(routes.values()) == {"repack"}, report["routes"]  # every Q4_1 matrix, in 4 bits
    assert store.repacked_ready("default")

    def no_child(*a, **k):
        raise AssertionError("a cached build must not be prepared again")

    monkeypatch.setattr(child, "run", no_child)
    assert resolver.ensure_model("default", "cpu_int4", 32) == target
    assert resolver.resolve("default").fit("cpu_int4").reasons, "run says why the file's codes"


def test_cli_prepare_quant(fake_bf16, capsys):
    from vllm_edge.cli import main

    assert main(["models", "prepare", "default", "--quant", "cpu_int4", "--group", "64"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("smollm2-135m-cpu_int4-g64") and store.quantized_ready("default", group=64)


def test_a_failed_first_use_prepare_is_a_clear_error(fake_bf16, monkeypatch):
    """The child's own error comes back as one message naming what was prepared, and nothing
    is cached: here the quantizer, in the child, refuses a group it does not write."""
    monkeypatch.setattr(store, "source_gguf", lambda m: "x.gguf")
    with pytest.raises(store.ModelNotAvailable, match=r"preparing default failed: group 256 is not "
                                                      r"supported.*nothing was cached"):
        resolver.ensure_model("default", "cpu_int4", 256)
    assert not store.quantized_dir(store.resolve_key("default"), "cpu_int4", 256).exists()
