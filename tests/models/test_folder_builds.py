"""A model folder as the model argument: quantized for this CPU on first use, cached by its
content, listed and removed with `models list` / `models rm` (tiny shapes; no engine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from vllm_edge.common import manifest
from vllm_edge.models import cache, child, resolver, store, synthetic
from vllm_edge.models.synthetic import Shape

AVX512 = json.dumps({"arch": "x86_64", "isa": ["avx512f"]})


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", AVX512)
    return tmp_path / "home"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A synthetic build (ours: it carries a manifest) and a plain copy of it, as a folder from
    elsewhere would be."""
    root = tmp_path_factory.mktemp("folder")
    tok = root / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "tokenizer_config.json").write_text("{}")
    (tok / "config.json").write_text(json.dumps({"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}))
    ours = synthetic.build(root / "ours", Shape.derive(128, 2, 512, heads=4, kv_heads=2, intermediate=256),
                           tokenizer_from=tok, progress=False)
    theirs = root / "theirs"
    shutil.copytree(ours, theirs)
    (theirs / manifest.NAME).unlink()
    return ours, theirs


@pytest.fixture
def folder(made, tmp_path):
    out = tmp_path / "my-model"
    shutil.copytree(made[1], out)
    return out


def _no_child(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a cached build must not be prepared again")

    monkeypatch.setattr(child, "run", refuse)


def test_a_folder_is_quantized_once_and_cached_by_content(home, folder, tmp_path, monkeypatch):
    from vllm_edge.runtime import weight_path

    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    path, wpath = weight_path.model_for_engine(str(folder))
    assert wpath.name == "cpu_int4" and any("a model folder" in r for r in wpath.reasons)
    assert path.parent == home / "models" / "hf" and path.name.endswith("-cpu_int4-g32")
    assert path.name.startswith(store.folder_sha256(folder)[:16]) and manifest.problem(path) is None
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "cpu_int4"
    assert manifest.read(path)["source"] == str(folder.resolve())
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the source is untouched

    _no_child(monkeypatch)
    assert weight_path.model_for_engine(str(folder))[0] == path
    copy = tmp_path / "elsewhere"  # the same bytes under another path: the same build
    shutil.copytree(folder, copy)
    assert resolver.ensure_model(str(copy)) == copy  # ensure_model alone resolves, never builds
    assert weight_path.model_for_engine(str(copy))[0] == path


def test_a_changed_folder_is_built_again(home, folder):
    a = store.prepare_folder(folder, progress=False)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-6
    (folder / "config.json").write_text(json.dumps(cfg))
    b = store.prepare_folder(folder, progress=False)
    assert a != b and manifest.problem(a) is None and manifest.problem(b) is None
    assert json.loads((b / "config.json").read_text())["rms_norm_eps"] == 1e-6


def test_bf16_runs_the_folder_as_stored(home, folder):
    from vllm_edge.runtime import weight_path

    path, wpath = weight_path.model_for_engine(str(folder), dtype="bf16")
    assert path == folder and wpath.name == "bf16"
    assert not (home / "models" / "hf").exists()


def test_our_builds_and_quantized_folders_run_as_stored(home, made, folder):
    from vllm_edge.runtime import weight_path

    ours = made[0]
    path, wpath = weight_path.model_for_engine(str(ours))
    assert path == ours and wpath.name == "bf16"
    built = store.prepare_folder(folder, progress=False)
    plain = folder.parent / "quantized-copy"
    shutil.copytree(built, plain)
    (plain / manifest.NAME).unlink()
    path, wpath = weight_path.model_for_engine(str(plain))
    assert path == plain and wpath.name == "cpu_int4"


def test_an_unsupported_architecture_is_refused_with_the_list(home, folder):
    from vllm_edge.quant.quantize import QuantizeError

    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GemmaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(QuantizeError, match=r"GemmaForCausalLM.*supported: LlamaForCausalLM, Qwen2ForCausalLM"):
        store.prepare_folder(folder, progress=False)
    assert not list((home / "models").rglob("*.safetensors"))


def test_a_folder_without_a_config_is_named(home, tmp_path):
    from vllm_edge.runtime import weight_path

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(store.ModelNotAvailable, match=r"empty/config.json: missing; a model folder must hold a Hugging Face config.json"):
        weight_path.model_for_engine(str(empty))


def _cli(*args, env_home):
    import os

    env = dict(os.environ, VLLM_EDGE_HOME=str(env_home))
    return subprocess.run([sys.executable, "-m", "vllm_edge.cli", "models", *args], env=env,
                          capture_output=True, text=True)


def test_models_list_and_rm(home, folder):
    from vllm_edge.runtime import weight_path

    built, _ = weight_path.model_for_engine(str(folder))
    name = f"hf/{built.name}"
    [b] = cache.builds()
    assert (b.name, b.scheme, b.source) == (name, "cpu_int4-g32", str(folder.resolve()))
    assert b.bytes == sum(p.stat().st_size for p in built.iterdir() if p.name != manifest.NAME)
    assert b.last_use is not None and b.problem is None

    listed = _cli("list", env_home=home)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(name))
    assert "cpu_int4-g32" in row and "just now" in row and str(folder.resolve()) in row
    js = [json.loads(line) for line in _cli("list", "--json", env_home=home).stdout.splitlines()]
    assert [j["name"] for j in js] == [name]

    # an unknown name removes nothing, even beside a known one
    bad = _cli("rm", name, "nope", env_home=home)
    assert bad.returncode != 0 and "nope: no such build" in bad.stderr and name in bad.stderr
    assert built.is_dir() and manifest.problem(built) is None

    ok = _cli("rm", name, env_home=home)
    assert ok.returncode == 0, ok.stderr
    assert not built.exists() and cache.builds() == []
    assert not [p for p in built.parent.iterdir() if not p.name.endswith(".lock")]


def test_a_broken_build_is_listed_as_broken_and_rebuilt(home, folder):
    built = store.prepare_folder(folder, progress=False)
    next(built.glob("*.safetensors")).write_bytes(b"")
    [b] = cache.builds()
    assert b.problem and "bytes" in b.problem
    again = store.prepare_folder(folder, progress=False)
    assert again == built and manifest.problem(again) is None


def test_rm_refuses_what_is_not_a_build(home, tmp_path):
    (home / "models" / "not-a-build").mkdir(parents=True)
    (home / "models" / "not-a-build" / "x").write_text("keep")
    with pytest.raises(cache.CacheError, match="not-a-build: no such build"):
        cache.remove("not-a-build")
    assert (home / "models" / "not-a-build" / "x").read_text() == "keep"


def test_bench_and_fidelity_quantize_a_folder_when_asked(home, folder, made):
    """They resolve models through ensure_model with the scheme they measure."""
    built = resolver.ensure_model(str(folder), "cpu_int4", 32)
    assert built.parent == home / "models" / "hf" and manifest.problem(built) is None
    assert resolver.ensure_model(str(folder)) == folder
    assert resolver.ensure_model(str(made[0]), "cpu_int4", 32) == made[0]  # ours: as stored


@pytest.fixture(scope="module")
def gptq_export(made, tmp_path_factory):
    from vllm_edge.quant.quantize import quantize_model

    out = quantize_model(made[1], tmp_path_factory.mktemp("gptq") / "ours", "gptq", 64, progress=False)
    theirs = out.parent / "my-gptq"
    shutil.copytree(out, theirs)
    (theirs / manifest.NAME).unlink()  # as a GPTQ folder from elsewhere would be
    return theirs


def test_a_gptq_folder_is_repacked_once_not_quantized_again(home, gptq_export, monkeypatch):
    from safetensors.torch import load_file

    from vllm_edge.models.gptq_repack import REPORT_NAME
    from vllm_edge.runtime import weight_path

    assert store.is_gptq_folder(gptq_export)
    path, wpath = weight_path.model_for_engine(str(gptq_export))
    assert path.parent == home / "models" / "hf" and path.name.endswith("-cpu_int4-gptq")
    assert (wpath.name, wpath.group) == ("cpu_int4", 64)
    assert any("GPTQ or AWQ folder" in r and "repacked" in r for r in wpath.reasons)
    report = json.loads((path / REPORT_NAME).read_text())
    assert report["group_size"] == 64 and report["repacked"] > 0 and report["max_error_over_bound"] <= 1
    assert json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"] == "cpu_int4"
    src_keys = set(load_file(next(gptq_export.glob("*.safetensors"))))
    assert any(k.endswith(".qweight") for k in src_keys)
    out_keys = set(load_file(next(path.glob("*.safetensors"))))
    assert not any(k.endswith(".qweight") for k in out_keys)
    [b] = cache.builds()
    assert (b.scheme, b.source, b.kind) == ("cpu_int4-g64", str(gptq_export.resolve()),
                                             "gptq-repack/1+folder/1")

    _no_child(monkeypatch)
    assert weight_path.model_for_engine(str(gptq_export))[0] == path
    assert store.prepare_folder(gptq_export, progress=False) == path
    # --quant none: vLLM's own loader gets the folder as it is
    stored, wp = weight_path.model_for_engine(str(gptq_export), dtype="bf16")
    assert stored == gptq_export and wp.name == "gptq"


def test_a_gptq_folder_that_cannot_be_repacked_is_named(home, gptq_export, tmp_path):
    from vllm_edge.models.gptq_repack import GptqSourceError

    bad = tmp_path / "gptq-8bit"
    shutil.copytree(gptq_export, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 8
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GptqSourceError, match=r"gptq-8bit/config.json: quantization_config bits=8"):
        store.prepare_folder(bad, progress=False)
    assert not (home / "models" / "hf").exists() or not list((home / "models" / "hf").glob("*-gptq"))
