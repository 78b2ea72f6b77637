"""VLLM_EDGE_FUSED_KV_ATTENTION decides what vLLM's CPU platform selects and whether the
compile-cache key says so; someone else's override of CPU_ATTN is left alone."""

from __future__ import annotations

import pytest

from vllm_edge import attention

UPSTREAM = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


@pytest.fixture
def restore():
    """Put the registry, vLLM's env table and our state back as they were."""
    from vllm import envs as vllm_envs
    from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES
    from vllm.v1.attention.selector import _cached_get_attn_backend

    overrides, factors, state = dict(_ATTN_OVERRIDES), dict(vllm_envs.environment_variables), dict(attention._state)
    yield
    _ATTN_OVERRIDES.clear()
    _ATTN_OVERRIDES.update(overrides)
    vllm_envs.environment_variables.clear()
    vllm_envs.environment_variables.update(factors)
    attention._state.clear()
    attention._state.update(state)
    _cached_get_attn_backend.cache_clear()


def _selected() -> type:
    """The class vLLM's selector gives a SmolLM2-shaped decoder layer in this process."""
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig, _cached_get_attn_backend

    config = AttentionSelectorConfig(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None)
    return _cached_get_attn_backend(None, config)


def _register(monkeypatch, value: str | None):
    if value is None:
        monkeypatch.delenv(attention.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(attention.ENV_SWITCH, value)
    attention._state.clear()  # as in a fresh process
    return {r.kind: r for r in attention.register()}


@pytest.mark.usefixtures("restore")
def test_on_by_default_selects_the_fused_backend_and_keys_the_compile_cache(monkeypatch):
    from vllm import envs as vllm_envs

    from vllm_edge.attention.cpu_fused import FusedKVCPUAttentionBackend

    attention.apply(False)
    stock_factors = vllm_envs.compile_factors()
    assert _selected().__name__ == "CPUAttentionBackend"
    regs = _register(monkeypatch, None)
    assert regs["attention_backend"].state == "registered" and regs["compile_factor"].state == "registered"
    assert attention.active()
    # Chosen by the CPU platform itself, and vLLM's cached choice was dropped.
    assert _selected() is FusedKVCPUAttentionBackend
    factors = vllm_envs.compile_factors()
    assert factors[attention.ENV_SWITCH] is True
    assert {k: v for k, v in factors.items() if k != attention.ENV_SWITCH} == stock_factors
    assert attention.register() == list(regs.values())  # idempotent


@pytest.mark.usefixtures("restore")
def test_off_leaves_vllms_backend_and_cache_key(monkeypatch):
    from vllm import envs as vllm_envs
    from vllm.platforms import current_platform

    attention.apply(True)
    assert _selected().__name__ == "FusedKVCPUAttentionBackend"
    regs = _register(monkeypatch, "0")
    assert regs["attention_backend"].state == regs["compile_factor"].state == f"skipped: {attention.ENV_SWITCH}=0"
    assert not attention.active()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert not AttentionBackendEnum.CPU_ATTN.is_overridden()
    assert AttentionBackendEnum.CPU_ATTN.get_path() == UPSTREAM
    assert _selected().__module__ == "vllm.v1.attention.backends.cpu_attn"
    assert attention.ENV_SWITCH not in vllm_envs.compile_factors()
    assert current_platform.is_cpu()


@pytest.mark.usefixtures("restore")
def test_someone_elses_override_is_kept(monkeypatch):
    from vllm import envs as vllm_envs
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    attention.apply(False)
    register_backend(AttentionBackendEnum.CPU_ATTN, "other.plugin.Backend")
    regs = _register(monkeypatch, "1")
    assert regs["attention_backend"].state.startswith("skipped: CPU_ATTN is already overridden by other.plugin")
    assert AttentionBackendEnum.CPU_ATTN.get_path() == "other.plugin.Backend"
    assert attention.ENV_SWITCH not in vllm_envs.environment_variables
    attention.apply(False)  # off does not remove it either
    assert AttentionBackendEnum.CPU_ATTN.get_path() == "other.plugin.Backend"


def test_the_plugin_registers_it():
    from vllm_edge import plugin

    plugin.register()
    names = {r.name: r.kind for r in plugin.registrations()}
    assert names[attention.NAME] == "attention_backend"
    assert names[f"{attention.NAME}:compile_factor"] == "compile_factor"
