"""kernel_rebind_scan without an engine: with numba imported, the pinned vLLM's kernel
override scan raises; the replacement scans past llvmlite's objects and still rebinds every
holder of a kernel."""

from __future__ import annotations

import sys
import types

import pytest

from vllm_edge.patches import kernel_rebind_scan as krs


def _upstream():
    from vllm.triton_utils import dispatcher

    fn = dispatcher._rebind_kernels
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "__vllm_edge_patch__", None) else fn


class Launcher:
    """Holds a kernel as an instance attribute, as vLLM's JIT warm-up owners do."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._kernel_arg_names = ("a", "b")


class Forwarder:
    """llvmlite's _lib_fn_wrapper in miniature: slots, and every unknown attribute forwarded."""

    __slots__ = ("_target",)

    def __init__(self):
        self._target = self

    def __getattr__(self, name):
        return self._target


@pytest.fixture
def holders():
    kernel, wrapper = object(), object()
    mod = types.ModuleType("vllm_edge_test_kernel_holders")
    mod.copy, mod.launcher, mod.forwarder = kernel, Launcher(kernel), Forwarder()
    sys.modules[mod.__name__] = mod
    yield mod, kernel, wrapper
    del sys.modules[mod.__name__]


def test_the_pinned_vllm_scan_fails_once_numba_is_imported():
    import numba  # noqa: F401  (the real trigger: llvmlite's module namespace)

    with pytest.raises(AttributeError, match="'_lib_fn_wrapper' object has no attribute 'get'"):
        _upstream()([])
    assert not krs._is_fixed_upstream(None, "_rebind_kernels", _upstream())


def test_the_replacement_scans_past_it_and_rebinds_every_holder(holders):
    import numba  # noqa: F401

    mod, kernel, wrapper = holders
    rebind = krs._make_replacement(None, "_rebind_kernels", _upstream())
    rebind([(kernel, wrapper)])
    assert mod.copy is wrapper and mod.launcher.kernel is wrapper
    assert "_kernel_arg_names" not in vars(mod.launcher)  # its launch binding is derived again
    assert isinstance(mod.forwarder, Forwarder)


def test_the_plugin_applies_it():
    from vllm_edge import patches

    patches.load_all()
    assert krs.PATCH.state is patches.State.APPLIED, krs.PATCH.detail
    from vllm.triton_utils import dispatcher

    assert dispatcher._rebind_kernels.__vllm_edge_patch__ == "kernel_rebind_scan"


def test_a_changed_signature_is_refused():
    with pytest.raises(LookupError, match="expects"):
        krs._make_replacement(None, "_rebind_kernels", lambda overrides, extra: None)
