"""The one resolver: each kind of model argument becomes its typed source, read once, with
nothing built; each source says what it becomes for a chosen format."""

from __future__ import annotations

import json
import shutil

import pytest

from vllm_edge.common import manifest
from vllm_edge.models import resolver, synthetic
from vllm_edge.models.errors import ModelNotAvailable
from vllm_edge.models.synthetic import Shape


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    root = tmp_path_factory.mktemp("resolver")
    tok = root / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    return synthetic.build(root / "ours", Shape.derive(64, 1, 256, heads=2, kv_heads=1, intermediate=128),
                           tokenizer_from=tok, progress=False)


def _plain_copy(src, dst, quant=None):
    shutil.copytree(src, dst)
    (dst / manifest.NAME).unlink()
    if quant is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = quant
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_each_argument_kind(ours, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    assert type(resolver.resolve("default")) is resolver.Embedded
    assert type(resolver.resolve("smollm2-135m")) is resolver.Embedded
    vlm = resolver.resolve("smolvlm-135m-cpu_int4-g64-vision")
    assert type(vlm) is resolver.Vlm and vlm.named == ("cpu_int4", 64, True)
    assert type(resolver.resolve("smolvlm-135m")) is resolver.Vlm
    assert type(resolver.resolve(str(tmp_path / "x.gguf"))) is resolver.Gguf  # checked when built
    assert type(resolver.resolve(str(ours))) is resolver.Stored  # ours: it carries a manifest
    plain = resolver.resolve(str(_plain_copy(ours, tmp_path / "plain")))
    assert type(plain) is resolver.Bf16Folder and plain.config["architectures"]
    gptq = resolver.resolve(str(_plain_copy(ours, tmp_path / "gptq", {"quant_method": "gptq", "bits": 4})))
    assert type(gptq) is resolver.QuantizedFolder and gptq.method == "gptq"
    fp8 = resolver.resolve(str(_plain_copy(ours, tmp_path / "fp8", {"quant_method": "fp8"})))
    assert type(fp8) is resolver.Stored
    assert not (tmp_path / "home").exists()  # resolving builds nothing


def test_what_each_source_becomes(ours, tmp_path):
    gptq = resolver.resolve(str(_plain_copy(ours, tmp_path / "gptq", {"quant_method": "gptq", "bits": 4})))
    assert gptq.fit("cpu_int4").scheme == "cpu_int4" and not gptq.fit("cpu_int4").stored
    assert gptq.fit("gptq").stored and gptq.fit(None).stored
    awq = resolver.resolve(str(_plain_copy(ours, tmp_path / "awq", {"quant_method": "awq", "bits": 4})))
    assert awq.fit("gptq").stored  # no format repacks AWQ into GPTQ: vLLM runs it as stored
    gguf = resolver.resolve(str(tmp_path / "m.gguf"))
    fit = gguf.fit("gptq", "gptq_w4a8")
    assert fit.fallback and fit.scheme == "cpu_int4"
    assert fit.reasons[0] == "a GGUF file has no gptq_w4a8 build; using cpu_int4"
    assert "Q4_0, Q4_1, Q4_K as cpu_int4; Q8_0, Q6_K, Q5_0, Q5_1, Q5_K as cpu_int8" in fit.reasons[1]
    assert resolver.resolve("smolvlm-135m").fit("gptq").scheme == "cpu_int4"
    assert resolver.resolve("default").fit("gptq") == resolver.Fit("gptq")


@pytest.mark.parametrize("arg, match", [
    ("no-such-model", r"no-such-model: no such model directory, and not an embedded model name"),
])
def test_a_bad_argument_is_named(arg, match):
    with pytest.raises(ModelNotAvailable, match=match):
        resolver.resolve(arg)


def test_a_folder_without_a_readable_config_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotAvailable, match=r"empty/config.json: missing; a model folder must hold "
                                                r"a Hugging Face config.json"):
        resolver.resolve(str(tmp_path / "empty"))
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ModelNotAvailable, match=r"deep/config.json: nested deeper than 64 levels"):
        resolver.resolve(str(deep))
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelNotAvailable, match=r"not a model directory, a GGUF file"):
        resolver.resolve(str(f))
