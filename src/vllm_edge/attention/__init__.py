"""Attention backends registered through vLLM's attention-backend registry.

The CPU platform of vLLM 0.32 always returns ``AttentionBackendEnum.CPU_ATTN.get_path()``,
which honours ``register_backend`` overrides, so overriding ``CPU_ATTN`` selects our
backend with no patch. :func:`register` is called by the plugin in every vLLM process; it
reads ``VLLM_EDGE_FUSED_KV_ATTENTION`` and is idempotent.

The override changes the compiled graph (one attention op per layer instead of two), and
vLLM's compile-cache key does not see it: the attention config asks for no backend either
way, and Dynamo's guards are dropped. An artifact compiled in one state and loaded in the
other would, compiled without the update op and run with the stock backend, never write
the KV cache. So while the override is active the switch is also one of vLLM's hashed
compile factors (``vllm.envs.environment_variables``, which ``envs.compile_factors()``
hashes for the AOT and the Inductor cache keys).
"""

from __future__ import annotations

import logging
import sys

from vllm_edge import envs
from vllm_edge.common.registration import Registration

ENV_SWITCH = "VLLM_EDGE_FUSED_KV_ATTENTION"
BACKEND = "vllm_edge.attention.cpu_fused.FusedKVCPUAttentionBackend"
NAME = "fused_kv_attention"

logger = logging.getLogger("vllm_edge.attention")

_state: dict[str, str] = {}  # "backend" / "compile_factor" -> "registered" | "skipped: ..."


def _compile_factor() -> bool:
    # Present only while the override is active, so the off state hashes as stock vLLM.
    return True


def active() -> bool:
    """Whether vLLM resolves ``CPU_ATTN`` to our backend in this process."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum.CPU_ATTN.get_path() == BACKEND


def apply(enabled: bool) -> dict[str, str]:
    """Install (``enabled``) or remove our override of ``CPU_ATTN`` and its compile factor.

    Never replaces someone else's override. Drops vLLM's cached backend choice, so a model
    built afterwards in this process gets the new state.
    """
    from vllm import envs as vllm_envs
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    member = AttentionBackendEnum.CPU_ATTN
    state: dict[str, str] = {}
    if not enabled:
        if active():
            member.clear_override()
        vllm_envs.environment_variables.pop(ENV_SWITCH, None)
        state = {"backend": f"skipped: {ENV_SWITCH}=0", "compile_factor": f"skipped: {ENV_SWITCH}=0"}
    elif member.is_overridden() and not active():
        why = f"skipped: CPU_ATTN is already overridden by {member.get_path()}"
        state = {"backend": why, "compile_factor": why}
    else:
        register_backend(member, BACKEND)
        vllm_envs.environment_variables[ENV_SWITCH] = _compile_factor
        state = {"backend": "registered", "compile_factor": "registered"}
    selector = sys.modules.get("vllm.v1.attention.selector")
    if selector is not None:  # @cache'd per (backend, config): would keep the old class
        selector._cached_get_attn_backend.cache_clear()
    _state.clear()
    _state.update(state)
    return dict(state)


def register() -> list[Registration]:
    """Apply the switch once per process; returns what was registered."""
    if not _state:
        try:
            apply(bool(envs.get(ENV_SWITCH)))
        except Exception as exc:  # an upstream API change must be visible, not fatal
            logger.warning("vllm-edge: cannot register the fused KV attention backend: %s", exc)
            _state.update({"backend": f"skipped: {exc}", "compile_factor": f"skipped: {exc}"})
    return [
        Registration(name=NAME, kind="attention_backend",
                     target="vllm.v1.attention.backends.registry:register_backend(CPU_ATTN)",
                     state=_state["backend"]),
        Registration(name=f"{NAME}:compile_factor", kind="compile_factor",
                     target=f"vllm.envs:environment_variables[{ENV_SWITCH}]",
                     state=_state["compile_factor"]),
    ]
