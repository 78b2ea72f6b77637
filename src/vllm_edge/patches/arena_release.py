"""Release allocator arenas after load, after the warm-up forward and after warm-up
(docs/design/patches.md).

vLLM 0.32.0's CPU worker never returns freed heap memory to the OS: garbage
from weight loading, repacking and compilation stays in the allocator's arenas
and counts as resident anonymous memory for the life of the process. We call
:func:`vllm_edge.runtime.memory.release_arenas` right after the worker's
``load_model``, ``determine_available_memory`` (it runs the warm-up forward; releasing
there, before the KV cache is allocated, keeps that garbage out of the start-up peak) and
``compile_or_warm_up_model``.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_edge.patches import Patch, source_of


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    return "malloc_trim" in src or "ReleaseFreeMemory" in src


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        from vllm_edge.runtime.memory import release_arenas

        release_arenas(attr)
        return result

    wrapper.__vllm_edge_patch__ = "arena_release"
    return wrapper


PATCH = Patch(
    name="arena_release",
    target=(
        "vllm.v1.worker.cpu_worker:CPUWorker.load_model",
        "vllm.v1.worker.cpu_worker:CPUWorker.determine_available_memory",
        "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model",
    ),
    reason=(
        "the CPU worker never returns freed heap to the OS, so load-time and compile-time "
        "garbage stays resident"
    ),
    fixed_when="the target methods already call malloc_trim / ReleaseFreeMemory",
    env_switch="VLLM_EDGE_PATCH_ARENA_RELEASE",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
