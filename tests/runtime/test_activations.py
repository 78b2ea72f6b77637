"""The products' activations by priority: int8 on a VNNI CPU at speed, bf16 at fidelity or
without VNNI, a user's value kept; and the engine arguments carry the choice."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import activations


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in activations.SWITCHES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("priority,vnni,want", [("speed", True, "1"), ("fidelity", True, "0"),
                                                ("speed", False, "0"), ("fidelity", False, "0")])
def test_the_switches_follow_the_priority_and_the_cpu(priority, vnni, want):
    env, reasons = {}, {}
    activations.apply(env, reasons, priority, vnni)
    assert env == {name: want for name in activations.SWITCHES}
    why = reasons[activations.KEY]
    assert ("int8" in why and "VPDPBUSD" in why) if want == "1" else why.startswith("bf16")


def test_a_value_in_the_environment_is_kept(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_LOWBIT_ACT8", "0")
    env, reasons = {}, {}
    activations.apply(env, reasons, "speed", True)
    assert env == {} and reasons[activations.KEY] == "VLLM_EDGE_LOWBIT_ACT8=0 given in the environment"


def test_the_edge_engine_applies_the_priority(tmp_path, monkeypatch):
    import json

    from vllm_edge.common import hw
    from vllm_edge.runtime.engine import edge_engine

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "vocab_size": 128}))
    real = hw.probe_cpu()
    monkeypatch.setattr(hw, "probe_cpu", lambda *a, **k: hw.CpuInfo(
        **{**real.__dict__, "isa": {**real.isa, "avx512_vnni": True}}))
    speed = edge_engine(tmp_path, max_model_len=128, enforce_eager=True)
    fidelity = edge_engine(tmp_path, max_model_len=128, enforce_eager=True, priority="fidelity")
    assert speed.env["VLLM_EDGE_INT4_ACT8"] == "1" and fidelity.env["VLLM_EDGE_INT4_ACT8"] == "0"
    assert fidelity.env["VLLM_EDGE_LOWBIT_ACT8"] == "0"
    assert any(line.startswith("VLLM_EDGE_INT4_ACT8=0: bf16") for line in fidelity.explain())
