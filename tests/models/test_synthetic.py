"""`vllm-edge models synthetic`: a Llama-shaped random checkpoint, sharded and atomic (tiny shapes only)."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_edge.models import synthetic
from vllm_edge.models.synthetic import Shape

TINY = dict(hidden=128, layers=2, vocab=512, heads=4, kv_heads=2)


@pytest.fixture
def tok_dir(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_text("{}")
    (d / "tokenizer_config.json").write_text("{}")
    (d / "chat_template.jinja").write_text("{{ messages }}")
    (d / "config.json").write_text(json.dumps({"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2,
                                               "rope_theta": 100000, "rms_norm_eps": 1e-5}))
    return d


def test_derive_matches_the_issue_1b_shape():
    s = Shape.derive(2048, 16, 49152)
    assert (s.intermediate, s.heads, s.kv_heads, s.tied) == (5632, 32, 8, True)
    assert 0.8e9 < s.parameters < 1.0e9  # tied: the head adds nothing


def test_bad_shapes():
    with pytest.raises(ValueError, match="divisible by heads"):
        Shape.derive(100, 1, 64, heads=3)
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        Shape.derive(128, 1, 64, heads=4, kv_heads=3)


@pytest.mark.parametrize("tied", [True, False])
def test_builds_a_loadable_llama(tmp_path, tok_dir, tied):
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = Shape.derive(**TINY, intermediate=256, tied=tied)
    out = synthetic.build(tmp_path / "syn", shape, tokenizer_from=tok_dir, max_shard_bytes=200_000,
                          progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files == sorted(p.name for p in out.glob("*.safetensors"))
    sd = {}
    for f in files:
        sd.update(load_file(str(out / f)))
    assert all(t.dtype == torch.bfloat16 for t in sd.values())
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in sd.values())
    q = sd["model.layers.0.self_attn.q_proj.weight"].float()
    assert 0.015 < q.std().item() < 0.025
    assert torch.equal(sd["model.norm.weight"], torch.ones(128, dtype=torch.bfloat16))

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is tied and cfg["eos_token_id"] == 2
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    manifest = json.loads((out / "vllm_edge_manifest.json").read_text())
    assert manifest["converter"] == synthetic.CONVERTER_VERSION and manifest["shape"]["layers"] == 2

    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "torch_dtype"}))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert unexpected == []
    assert set(missing) <= ({"lm_head.weight"} if tied else set())


def test_same_seed_same_weights(tmp_path, tok_dir):
    from safetensors.torch import load_file

    shape = Shape.derive(**TINY)
    a = synthetic.build(tmp_path / "a", shape, tokenizer_from=tok_dir, progress=False)
    b = synthetic.build(tmp_path / "b", shape, tokenizer_from=tok_dir, progress=False)
    ta, tb = (load_file(str(next(p.glob("*.safetensors")))) for p in (a, b))
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


def test_failure_leaves_nothing(tmp_path, tok_dir, disk_full):
    with pytest.raises(RuntimeError, match="disk full"):
        synthetic.build(tmp_path / "syn", Shape.derive(**TINY), tokenizer_from=tok_dir, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".syn.lock", "tok"]  # the lock file stays


def test_needs_a_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        synthetic.build(tmp_path / "syn", Shape.derive(**TINY), tokenizer_from=tmp_path, progress=False)


def test_cli(tmp_path, tok_dir):
    from vllm_edge.cli import main

    out = tmp_path / "cli"
    assert main(["models", "synthetic", str(out), "--hidden", "128", "--layers", "1", "--vocab", "512",
                 "--intermediate", "256", "--heads", "4", "--kv-heads", "2", "--no-tied",
                 "--tokenizer-from", str(tok_dir)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["tie_word_embeddings"], cfg["num_key_value_heads"]) == (1, False, 2)
    assert main(["models", "synthetic", str(tmp_path / "bad"), "--hidden", "100", "--heads", "3",
                 "--tokenizer-from", str(tok_dir)]) == 2


@pytest.mark.parametrize("arch,cls", [("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")])
def test_builds_a_loadable_second_arch(tmp_path, tok_dir, arch, cls):
    """Every tensor the transformers class expects is written, and nothing else."""
    import transformers
    from safetensors.torch import load_file

    shape = Shape.derive(**TINY, intermediate=256, tied=True, arch=arch)
    out = synthetic.build(tmp_path / arch, shape, tokenizer_from=tok_dir, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [cls]
    sd = {}
    for f in out.glob("*.safetensors"):
        sd.update(load_file(str(f)))
    model = getattr(transformers, cls)(transformers.AutoConfig.for_model(**cfg))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if arch == "qwen2":
        assert 0.4 < sd["model.layers.0.self_attn.k_proj.bias"].float().std().item() < 0.6
    else:
        assert "model.layers.1.self_attn.q_norm.weight" in sd


def test_unknown_arch():
    with pytest.raises(ValueError, match="arch 'gpt2'"):
        Shape.derive(128, 1, 64, arch="gpt2")
