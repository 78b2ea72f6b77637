"""When the edge engines put every layer in one KV cache group (no engine started)."""

from __future__ import annotations

import json

import pytest

from vllm_edge.runtime import kv_groups
from vllm_edge.runtime.engine import edge_engine
from vllm_edge.serving.serve import vllm_flags

from .test_kv import GEMMA3  # Gemma 3 270M's shape: every sixth layer global, a 512-token window elsewhere

# Mistral's first release: one window on every layer, a single group already
ALL_WINDOWED = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 256,
                "sliding_window": 128}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 256}


def _model(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_mixed_model_gets_one_group_and_the_flag_reaches_the_server(tmp_path, monkeypatch):
    monkeypatch.delenv(kv_groups.ENV_SWITCH, raising=False)
    edge = edge_engine(_model(tmp_path, GEMMA3), max_model_len=1024, enforce_eager=True)
    assert edge.kwargs[kv_groups.VLLM_ARG] is True
    why = edge.reasons[kv_groups.VLLM_ARG]
    assert "15 of 18 layers have a 512-token window" in why and "still applies" in why
    assert "--disable-hybrid-kv-cache-manager" in vllm_flags(edge.kwargs)


@pytest.mark.parametrize("config", [LLAMA, ALL_WINDOWED], ids=["no window", "every layer windowed"])
def test_a_model_of_one_kind_of_layer_is_left_to_vllm(tmp_path, monkeypatch, config):
    monkeypatch.delenv(kv_groups.ENV_SWITCH, raising=False)
    edge = edge_engine(_model(tmp_path, config), max_model_len=512, enforce_eager=True)
    assert kv_groups.VLLM_ARG not in edge.kwargs and kv_groups.VLLM_ARG not in edge.reasons


def test_the_switch_and_a_given_budget_keep_the_hybrid_manager(tmp_path, monkeypatch):
    model = _model(tmp_path, GEMMA3)
    monkeypatch.setenv(kv_groups.ENV_SWITCH, "0")
    edge = edge_engine(model, max_model_len=1024, enforce_eager=True)
    assert kv_groups.VLLM_ARG not in edge.kwargs
    assert f"{kv_groups.ENV_SWITCH}=0" in edge.reasons[kv_groups.VLLM_ARG]
    monkeypatch.delenv(kv_groups.ENV_SWITCH)
    flat = edge.kwargs["kv_cache_memory_bytes"]
    given = edge_engine(model, max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=flat * 2)
    assert kv_groups.VLLM_ARG not in given.kwargs
    assert "the KV budget was given" in given.reasons[kv_groups.VLLM_ARG]
