"""Guarded, self-reporting patches for upstream bugs.

A patch replaces one attribute on a vLLM or torch object to work around a bug
of the pinned vLLM release. Each patch module defines ``PATCH`` (a
:class:`Patch`). Applying it ends in exactly one :class:`State`, recorded once
per process and never changed afterwards:

- ``applied``: the attribute was replaced;
- ``fixed-upstream``: the bug is gone, nothing was done;
- ``disabled``: its env switch is off;
- ``target-missing``: the target does not exist, or no longer has the shape the
  replacement was written for (``make_replacement`` raised ``LookupError``).
  Logged as a WARNING; `doctor` exits non-zero. This is the state that catches a
  patch that would otherwise silently become a no-op after a vLLM upgrade.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_edge import envs

logger = logging.getLogger("vllm_edge.patches")

# Patch modules, in application order.
PATCH_MODULES: tuple[str, ...] = ("aot_cache", "kv_budget", "arena_release", "weight_huge_pages",
                                  "hermes_json_end",
                                  "amx_attention", "greedy_sampler", "slot_mapping_bind",
                                  "pp_stage_buffer", "wna16_missing_op", "gemma2_embedding_quant",
                                  "tokenizer_build_lists", "tokenizer_copies",
                                  "processor_template_probe",
                                  "kernel_rebind_scan")


class State(str, enum.Enum):
    APPLIED = "applied"
    FIXED_UPSTREAM = "fixed-upstream"
    DISABLED = "disabled"
    TARGET_MISSING = "target-missing"


@dataclass
class Patch:
    name: str
    target: str | tuple[str, ...]  # "module:qualname", or several replaced together
    reason: str  # the upstream behaviour worked around
    fixed_when: str  # how we tell that upstream has fixed it
    env_switch: str  # declared in envs.py, bool, default on
    # (owner, attr_name, current_value) -> True when the bug is gone upstream.
    is_fixed_upstream: Callable[[Any, str, Any], bool]
    # (owner, attr_name, current_value) -> replacement value.
    make_replacement: Callable[[Any, str, Any], Any]
    state: State | None = field(default=None, init=False)
    detail: str = field(default="", init=False)
    original: Any = field(default=None, init=False, repr=False)

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target,) if isinstance(self.target, str) else tuple(self.target)

    def describe(self) -> dict[str, str]:
        return {
            "name": self.name,
            "target": ", ".join(self.targets),
            "state": self.state.value if self.state else "not-loaded",
            "detail": self.detail,
            "reason": self.reason,
            "fixed_when": self.fixed_when,
            "env_switch": self.env_switch,
        }


def source_of(current: Any) -> str | None:
    """The source of a patch target, for a fixed-upstream check that reads it; None when it has
    none to read (a builtin, or code without a file): such a check then says "not fixed"."""
    try:
        return inspect.getsource(current)
    except (OSError, TypeError):
        return None


def check_params(name: str, original: Any, expected: tuple[str, ...]) -> None:
    """Raise LookupError (the patch becomes ``target-missing``) when ``original`` no longer takes
    the parameters its replacement was written for."""
    params = tuple(inspect.signature(original).parameters)
    if params != expected:
        raise LookupError(f"{name} takes {params}, the patch expects {expected}")


def resolve(target: str) -> tuple[Any, str, Any]:
    """``module:a.b.c`` -> (object holding c, "c", current value). Raises LookupError."""
    if ":" not in target:
        raise LookupError(f"target {target!r} is not of the form module:qualname")
    mod_name, qualname = target.split(":", 1)
    try:
        owner: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise LookupError(f"module {mod_name} cannot be imported: {exc}") from None
    parts = qualname.split(".")
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise LookupError(f"{mod_name} has no attribute path {qualname}")
        owner = getattr(owner, part)
    if not hasattr(owner, parts[-1]):
        raise LookupError(f"{mod_name} has no attribute path {qualname}")
    return owner, parts[-1], getattr(owner, parts[-1])


_lock = threading.Lock()
_loaded: dict[str, Patch] = {}


def _apply(patch: Patch) -> None:
    overrides = envs.get("VLLM_EDGE_PATCH_TARGET_OVERRIDE") or {}
    if patch.name in overrides:
        patch.target = overrides[patch.name] if isinstance(overrides[patch.name], str) else tuple(overrides[patch.name])
    if not envs.get(patch.env_switch):
        patch.state, patch.detail = State.DISABLED, f"{patch.env_switch}=0"
        return
    resolved = []
    for target in patch.targets:  # all or nothing: a half-applied patch is worse than none
        try:
            resolved.append(resolve(target))
        except LookupError as exc:
            _missing(patch, target, exc)
            return
    if all(patch.is_fixed_upstream(*r) for r in resolved):
        patch.state, patch.detail = State.FIXED_UPSTREAM, patch.fixed_when
        return
    replacements = []
    for target, (owner, attr, current) in zip(patch.targets, resolved):
        try:  # every replacement is built before any attribute changes
            replacements.append(patch.make_replacement(owner, attr, current))
        except LookupError as exc:
            _missing(patch, target, exc)
            return
    for (owner, attr, _), new in zip(resolved, replacements):
        setattr(owner, attr, new)
    originals = [current for _, _, current in resolved]
    patch.original = originals[0] if len(originals) == 1 else tuple(originals)
    patch.state = State.APPLIED


def _missing(patch: Patch, target: str, exc: LookupError) -> None:
    patch.state, patch.detail = State.TARGET_MISSING, str(exc)
    logger.warning(
        "vllm-edge patch %r: target %s is missing (%s). The workaround is NOT "
        "active; run `vllm-edge doctor`.", patch.name, target, exc,
    )


def load_all() -> list[Patch]:
    """Apply every patch once per process; later calls return the same states."""
    with _lock:
        for mod_name in PATCH_MODULES:
            if mod_name in _loaded:
                continue
            module = importlib.import_module(f"{__name__}.{mod_name}")
            patch: Patch = module.PATCH
            _apply(patch)
            _loaded[mod_name] = patch
            if patch.state is not State.TARGET_MISSING:
                logger.debug("vllm-edge patch %s: %s", patch.name, patch.state.value)
        return [_loaded[m] for m in PATCH_MODULES]


def states() -> dict[str, str]:
    """Patch name -> state for patches loaded in this process."""
    return {p.name: p.state.value for p in _loaded.values() if p.state is not None}
