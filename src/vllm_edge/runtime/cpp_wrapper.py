"""The compiled graph's wrapper in C++: Inductor's ``cpp_wrapper`` for every compiled engine.

On CPU vLLM 0.32 compiles the whole forward as one Inductor graph, and Inductor's default
wrapper around it is Python: one interpreted call per fused kernel, per custom op (the packed
and int4 products, attention) and per buffer, a few hundred per decode step. At batch 1 on a
small model that Python is a large share of the step, with the second OpenMP thread waiting
on it. ``cpp_wrapper`` generates that wrapper as C++ instead, compiled once with the graph
and kept in the same caches.

Two settings come with it:

- ``VLLM_USE_LAYERNAME=0``. vLLM 0.32 passes the layer name of its attention and KV-cache ops
  as an opaque Python object on torch 2.11 and later, which Inductor's C++ wrapper cannot
  pass to a custom op ("arg type PyObject is not yet supported"). As a plain string it can.
  The variable is one of vLLM's compile-cache factors, so the two graphs never share a cache
  entry. A value the user set is kept, and then the wrapper stays Python.
- ``cpp_wrapper_build_separate``: the wrapper and the kernels are compiled as separate
  objects. In one object a cold compile of a small model's graph took about twice as long
  on a 2-core host; separate objects cost less of it and decoded as fast.

``compilation_config`` is part of vLLM's compile-cache key, so graphs built before (Python
wrapper) are not reused for it. ``VLLM_EDGE_CPP_WRAPPER=0`` keeps Inductor's Python wrapper.
"""

from __future__ import annotations

import sys
from typing import Any

ENV_SWITCH = "VLLM_EDGE_CPP_WRAPPER"
LAYERNAME_ENV = "VLLM_USE_LAYERNAME"
INDUCTOR_CONFIG = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}


def decide() -> tuple[bool, str]:
    """Whether compiled engines get the C++ wrapper here, and why."""
    from vllm_edge import envs

    if not envs.get(ENV_SWITCH):
        return False, f"{ENV_SWITCH}=0: Inductor's Python wrapper"
    if envs.get(LAYERNAME_ENV):
        return False, (f"{LAYERNAME_ENV} is set on in the environment: vLLM then passes layer "
                       "names as Python objects, which Inductor's C++ wrapper cannot pass, so "
                       "the wrapper stays Python")
    torch_utils = sys.modules.get("vllm.utils.torch_utils")
    if torch_utils is not None and getattr(torch_utils, "_USE_LAYERNAME", False):
        # its op schemas took their layer-name type at import: the variable comes too late
        return False, ("vLLM was imported in this process before the engine's environment, "
                       "with layer names as Python objects, so the wrapper stays Python")
    return True, ("Inductor's cpp_wrapper (built apart from the kernels): the compiled graph "
                  "calls its kernels and custom ops from C++, not from a Python function; "
                  f"{LAYERNAME_ENV}=0 so that attention's layer name is a string it can pass")


def apply(kwargs: dict[str, Any], env: dict[str, str], reasons: dict[str, str]) -> None:
    """Add the C++ wrapper to a compiled engine's arguments and environment (in place), or
    say why not. The caller leaves an eager engine alone."""
    on, why = decide()
    if not on:
        reasons["compilation_config"] = why
        return
    config = dict(kwargs.get("compilation_config") or {})
    config["inductor_compile_config"] = {**config.get("inductor_compile_config", {}), **INDUCTOR_CONFIG}
    kwargs["compilation_config"] = config
    env[LAYERNAME_ENV] = "0"
    reasons["compilation_config"] = why
    reasons[LAYERNAME_ENV] = "the C++ wrapper passes attention's layer name as a string"
