"""An explicit KV budget wins on CPU (docs/design/patches.md).

vLLM 0.32.0's ``CpuPlatform.check_and_update_config`` ends with a "Legacy
setting" block: whenever ``VLLM_CPU_KVCACHE_SPACE`` is set it overwrites
``cache_config.kv_cache_memory_bytes`` with whole GiB, so
``LLM(..., kv_cache_memory_bytes=N)`` and ``--kv-cache-memory-bytes`` are
silently discarded. The fix wraps that method: an explicit value present before
the call is put back after it. The env var still applies when nothing explicit
was given.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_edge.patches import Patch, source_of

logger = logging.getLogger("vllm_edge.patches.kv_budget")

_OVERWRITE = "cache_config.kv_cache_memory_bytes = kv_cache_space"


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    if _OVERWRITE not in src:
        return True
    # Fixed if upstream only falls back to the env var when no explicit budget is set.
    before = src.split(_OVERWRITE)[0].rsplit("VLLM_CPU_KVCACHE_SPACE", 1)[-1]
    return "kv_cache_memory_bytes is None" in before


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    func = original.__func__  # a classmethod, bound to CpuPlatform

    @functools.wraps(func)
    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        cache_config = getattr(vllm_config, "cache_config", None)
        explicit = getattr(cache_config, "kv_cache_memory_bytes", None)
        func(cls, vllm_config)
        if explicit is not None and cache_config.kv_cache_memory_bytes != explicit:
            logger.info(
                "vllm-edge kv_budget: keeping the explicit kv_cache_memory_bytes=%d "
                "(VLLM_CPU_KVCACHE_SPACE had replaced it with %d)",
                explicit, cache_config.kv_cache_memory_bytes,
            )
            cache_config.kv_cache_memory_bytes = explicit

    check_and_update_config.__vllm_edge_patch__ = "kv_budget"
    return classmethod(check_and_update_config)


PATCH = Patch(
    name="kv_budget",
    target="vllm.platforms.cpu:CpuPlatform.check_and_update_config",
    reason=(
        "VLLM_CPU_KVCACHE_SPACE, when set, overwrites an explicit kv_cache_memory_bytes "
        "with whole GiB, so the explicit budget has no effect."
    ),
    fixed_when=(
        "the target no longer assigns kv_cache_memory_bytes from the env var, or only does "
        "so when kv_cache_memory_bytes is None"
    ),
    env_switch="VLLM_EDGE_PATCH_KV_BUDGET",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
