"""vLLM's Triton-kernel override scan survives objects whose ``vars()`` is not a dict.

vLLM 0.32.0 registers its CPU replacements for Triton kernels at every worker start
(``CpuPlatform.register_triton_kernel_overrides`` -> ``dispatcher.register_kernels``). Its
``_rebind_kernels`` walks every attribute of every module in ``sys.modules`` and, for each
value with a ``__dict__``, calls ``vars(value).get("kernel")``. llvmlite (numba's backend)
keeps ``_lib_fn_wrapper`` objects in its module namespace: they have ``__slots__`` and forward
unknown attributes to a ctypes function, so ``vars()`` returns something without ``.get`` and
the scan raises ``AttributeError``. Any process that has imported numba therefore cannot
start a vLLM engine: the second engine after one with n-gram speculation (vLLM's n-gram
proposer imports numba), or one started by a program that uses numba itself.

The replacement does the same rebinding, reading an instance's own attributes only when they
form a mapping, and skipping values whose ``vars()`` fails.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from vllm_edge.patches import Patch, check_params, source_of

def _own_attributes(value: Any) -> Mapping | None:
    try:
        own = vars(value)
    except TypeError:  # no instance dictionary at all
        return None
    return own if isinstance(own, Mapping) else None


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    return "vars(value).get" not in src


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    check_params(attr, original, ("overrides",))

    def _rebind_kernels(overrides: Any) -> None:
        pairs = list(overrides)

        def wrapper_of(value: Any) -> Any:
            for kernel, wrapper in pairs:  # identity only, as upstream: some values fail on ==
                if value is kernel:
                    return wrapper
            return None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, Mapping) or not namespace:
                continue
            for name, value in list(namespace.items()):
                wrapper = wrapper_of(value)
                if wrapper is not None:  # a module-level copy of the kernel
                    setattr(module, name, wrapper)
                    continue
                own = _own_attributes(value)
                if own is None:
                    continue
                wrapper = wrapper_of(own.get("kernel"))  # an object that launches the kernel
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)  # its cached launch binding

    _rebind_kernels.__vllm_edge_patch__ = "kernel_rebind_scan"
    _rebind_kernels.__wrapped__ = original
    return _rebind_kernels


PATCH = Patch(
    name="kernel_rebind_scan",
    target="vllm.triton_utils.dispatcher:_rebind_kernels",
    reason=(
        "the worker's Triton-kernel override scan calls vars(value).get on every module "
        "attribute and raises on llvmlite's objects, so no engine starts in a process that "
        "imported numba (e.g. after an engine with n-gram speculation)"
    ),
    fixed_when="_rebind_kernels no longer calls vars(value).get",
    env_switch="VLLM_EDGE_PATCH_KERNEL_REBIND_SCAN",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
