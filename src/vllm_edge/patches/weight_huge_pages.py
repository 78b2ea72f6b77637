"""Put the model's weights in 2 MB pages after the worker loads them
(docs/design/patches.md, mechanism in :mod:`vllm_edge.runtime.huge_pages`).

vLLM 0.32.0's CPU worker leaves its weights in ordinary heap memory, which on a Linux whose
transparent huge pages are ``madvise`` only (most distributions' default) is 4 KB pages; every
decode step streams all of them. We collapse the memory they cover into huge pages right after
the worker's ``load_model`` (the weights are packed by then), in place: no tensor moves.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_edge.patches import Patch, source_of


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    return "MADV_COLLAPSE" in src or "MADV_HUGEPAGE" in src


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        from vllm_edge.runtime import huge_pages

        huge_pages.apply(self.model_runner.get_model())
        return result

    wrapper.__vllm_edge_patch__ = "weight_huge_pages"
    return wrapper


PATCH = Patch(
    name="weight_huge_pages",
    target="vllm.v1.worker.cpu_worker:CPUWorker.load_model",
    reason=(
        "the CPU worker keeps the weights decode streams every step in 4 KB pages where "
        "transparent huge pages are madvise-only"
    ),
    fixed_when="the target method already asks for huge pages (MADV_HUGEPAGE / MADV_COLLAPSE)",
    env_switch="VLLM_EDGE_PATCH_WEIGHT_HUGE_PAGES",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
