"""CPU AOT compile-cache load (docs/design/patches.md).

vLLM 0.32.0's ``_try_load_aot_compiled_fn`` calls
``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)``. With the
inductor CPU backend the deserialized ``compiled_fn`` is a plain function
without that method, so every load fails with AttributeError and vLLM
recompiles the model at every start.

The fix is as narrow as we could make it: for the duration of that one vLLM
function, the artifact loader it calls attaches a no-op ``finalize_loading`` to
a loaded ``compiled_fn`` that lacks one. A plain inductor function is already
fully loaded, so there is nothing to finalize. Artifacts that have the method
(vLLM's own serializable functions) are left untouched.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm_edge.patches import Patch, source_of

logger = logging.getLogger("vllm_edge.patches.aot_cache")

# Loaded artifacts that got the no-op in this process; tests and doctor read it.
attached: list[str] = []

_BUGGY_CALL = "compiled_fn.finalize_loading("


def _noop_finalize_loading(vllm_config: Any) -> None:
    return None


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    # The bug is the unguarded call; once upstream guards or removes it, we stand down.
    src = source_of(current)
    if src is None:
        return False
    return _BUGGY_CALL not in src


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def _try_load_aot_compiled_fn(*args: Any, **kwargs: Any) -> Any:
        real_load = torch.compiler.load_compiled_function

        @functools.wraps(real_load)
        def load_compiled_function(*a: Any, **kw: Any) -> Any:
            loaded = real_load(*a, **kw)
            artifacts = getattr(loaded, "_artifacts", None)
            compiled_fn = getattr(artifacts, "compiled_fn", None)
            if compiled_fn is not None and not hasattr(compiled_fn, "finalize_loading"):
                try:
                    compiled_fn.finalize_loading = _noop_finalize_loading
                except (AttributeError, TypeError):
                    logger.warning(
                        "vllm-edge aot_cache: cannot attach finalize_loading to %s; "
                        "vLLM will recompile", type(compiled_fn).__name__,
                    )
                else:
                    attached.append(type(compiled_fn).__name__)
                    logger.info(
                        "vllm-edge aot_cache: %s has no finalize_loading; attached a no-op "
                        "so the cached artifact loads", type(compiled_fn).__name__,
                    )
            return loaded

        torch.compiler.load_compiled_function = load_compiled_function
        try:
            return original(*args, **kwargs)
        finally:
            torch.compiler.load_compiled_function = real_load

    _try_load_aot_compiled_fn.__vllm_edge_patch__ = "aot_cache"
    return _try_load_aot_compiled_fn


PATCH = Patch(
    name="aot_cache",
    target="vllm.compilation.decorators:_try_load_aot_compiled_fn",
    reason=(
        "On CPU the loaded AOT artifact is a plain function without finalize_loading; "
        "the load raises AttributeError and vLLM recompiles the model at every start."
    ),
    fixed_when=(
        "the target no longer calls compiled_fn.finalize_loading( unguarded; and at "
        "run time, any artifact that already has finalize_loading is left alone"
    ),
    env_switch="VLLM_EDGE_PATCH_AOT_CACHE",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
