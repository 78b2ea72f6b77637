"""The patch framework and the AOT cache patch, without an engine."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from vllm_edge import envs, patches
from vllm_edge.patches import Patch, State, aot_cache


@pytest.fixture
def fake_module(monkeypatch):
    mod = types.ModuleType("fake_upstream")

    class Engine:
        def buggy(self):
            return "upstream"

    mod.Engine = Engine
    mod.fixed_flag = False
    monkeypatch.setitem(sys.modules, "fake_upstream", mod)
    return mod


def _patch(target: str | tuple[str, ...], fixed=lambda o, a, c: False) -> Patch:
    return Patch(
        name="fake", target=target, reason="r", fixed_when="f", env_switch="VLLM_EDGE_PATCH_AOT_CACHE",
        is_fixed_upstream=fixed, make_replacement=lambda o, a, cur: (lambda self: "patched"),
    )


def test_applied_replaces_the_attribute(fake_module):
    p = _patch("fake_upstream:Engine.buggy")
    patches._apply(p)
    assert p.state is State.APPLIED
    assert fake_module.Engine().buggy() == "patched"
    assert p.original(fake_module.Engine()) == "upstream"


def test_fixed_upstream_does_nothing(fake_module):
    p = _patch("fake_upstream:Engine.buggy", fixed=lambda o, a, c: True)
    patches._apply(p)
    assert p.state is State.FIXED_UPSTREAM
    assert fake_module.Engine().buggy() == "upstream"


def test_disabled_by_env_switch(fake_module, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_PATCH_AOT_CACHE", "0")
    p = _patch("fake_upstream:Engine.buggy")
    patches._apply(p)
    assert p.state is State.DISABLED
    assert fake_module.Engine().buggy() == "upstream"


@pytest.mark.parametrize("target", [
    "fake_upstream:Engine.gone", "fake_upstream:Nope.buggy", "no_such_module_xyz:f", "not-a-target",
])
def test_target_missing_is_loud(fake_module, caplog, target):
    p = _patch(target)
    with caplog.at_level(logging.WARNING, logger="vllm_edge.patches"):
        patches._apply(p)
    assert p.state is State.TARGET_MISSING
    assert any("'fake'" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_target_of_the_wrong_shape_is_loud_and_nothing_is_replaced(fake_module, caplog):
    fake_module.Engine.other = lambda self: "upstream other"

    def replace(owner, attr, current):
        if attr == "other":
            raise LookupError("other no longer has the shape this patch needs")
        return lambda self: "patched"

    p = _patch(("fake_upstream:Engine.buggy", "fake_upstream:Engine.other"))
    p.make_replacement = replace
    with caplog.at_level(logging.WARNING, logger="vllm_edge.patches"):
        patches._apply(p)
    assert p.state is State.TARGET_MISSING and "shape" in p.detail
    assert fake_module.Engine().buggy() == "upstream"  # all or nothing
    assert any("'fake'" in r.getMessage() for r in caplog.records)


def test_load_all_is_idempotent_and_states_never_change(monkeypatch):
    # the greedy sampler is off unless switched on: the suite runs the shipped defaults
    greedy = State.APPLIED if envs.get("VLLM_EDGE_PATCH_GREEDY_SAMPLER") else State.DISABLED
    first = {p.name: p.state for p in patches.load_all()}
    replaced = sys.modules["vllm.compilation.decorators"]._try_load_aot_compiled_fn
    # Flipping the switch after load must not silently change a reached state.
    monkeypatch.setenv("VLLM_EDGE_PATCH_AOT_CACHE", "0")
    second = {p.name: p.state for p in patches.load_all()}
    assert first == second == {"aot_cache": State.APPLIED, "kv_budget": State.APPLIED,
                               "arena_release": State.APPLIED,
                               "weight_huge_pages": State.APPLIED,
                               "hermes_json_end": State.APPLIED, "amx_attention": State.APPLIED,
                               "greedy_sampler": greedy, "slot_mapping_bind": State.APPLIED,
                               "pp_stage_buffer": State.APPLIED, "wna16_missing_op": State.APPLIED,
                               "gemma2_embedding_quant": State.APPLIED,
                               "tokenizer_build_lists": State.APPLIED,
                               "tokenizer_copies": State.APPLIED,
                               "processor_template_probe": State.APPLIED,
                               "kernel_rebind_scan": State.APPLIED}
    assert sys.modules["vllm.compilation.decorators"]._try_load_aot_compiled_fn is replaced
    assert getattr(replaced, "__vllm_edge_patch__", None) == "aot_cache"


def test_aot_detects_the_bug_in_the_pinned_vllm():
    import vllm.compilation.decorators as dec

    original = aot_cache.PATCH.original or dec._try_load_aot_compiled_fn
    assert not aot_cache._is_fixed_upstream(dec, "_try_load_aot_compiled_fn", original)


def test_aot_stands_down_when_upstream_guards_the_call():
    def _try_load_aot_compiled_fn(model, path):  # a fixed upstream: no unguarded call
        fn = load()
        if hasattr(fn, "finalize_loading"):
            fn.finalize_loading(model)

    assert aot_cache._is_fixed_upstream(None, "_try_load_aot_compiled_fn", _try_load_aot_compiled_fn)


class _Artifacts:
    def __init__(self, compiled_fn):
        self.compiled_fn = compiled_fn


class _Loaded:
    def __init__(self, compiled_fn):
        self._artifacts = _Artifacts(compiled_fn)


def _run_shimmed(loaded_obj):
    """Drive the replacement the way vLLM does: it calls torch.compiler.load_compiled_function
    and then finalize_loading on the artifact."""
    import torch

    real = torch.compiler.load_compiled_function

    def fake_upstream(model, path):
        got = torch.compiler.load_compiled_function(None)
        got._artifacts.compiled_fn.finalize_loading("cfg")
        return got

    torch.compiler.load_compiled_function = lambda *a, **k: loaded_obj
    try:
        wrapped = aot_cache._make_replacement(None, "x", fake_upstream)
        return wrapped(None, "p"), torch.compiler.load_compiled_function
    finally:
        torch.compiler.load_compiled_function = real


def test_shim_attaches_noop_to_a_plain_function():
    def plain(*a):
        return 1

    before = len(aot_cache.attached)
    loaded, restored = _run_shimmed(_Loaded(plain))
    assert loaded._artifacts.compiled_fn.finalize_loading("cfg") is None
    assert len(aot_cache.attached) == before + 1
    # The loader swap lasts only for the call.
    assert getattr(restored, "__wrapped__", None) is None


def test_shim_leaves_an_artifact_that_has_finalize_loading():
    calls = []

    class Serializable:
        def finalize_loading(self, cfg):
            calls.append(cfg)

    obj = Serializable()
    before = len(aot_cache.attached)
    _run_shimmed(_Loaded(obj))
    assert calls == ["cfg"]
    assert len(aot_cache.attached) == before
    assert "finalize_loading" not in vars(obj)


def test_without_the_shim_the_plain_function_fails_like_upstream():
    # The bug the patch exists for, reproduced on the same fake: no shim -> AttributeError.
    def plain(*a):
        return 1

    with pytest.raises(AttributeError, match="finalize_loading"):
        _Loaded(plain)._artifacts.compiled_fn.finalize_loading("cfg")


def test_amx_attention_falls_back_to_the_avx512_kernel_only_where_amx_was_chosen():
    import torch

    from vllm_edge.patches import amx_attention

    patches.load_all()
    import vllm.v1.attention.backends.cpu_attn as cpu_attn

    patched = cpu_attn._get_attn_isa
    assert getattr(patched, "__vllm_edge_patch__", None) == "amx_attention"
    original = amx_attention.PATCH.original
    chosen = original(torch.bfloat16, 128, 64)
    if torch.cpu._is_amx_tile_supported():
        assert chosen == "amx"  # vLLM 0.32's pick on this CPU, the one that crashes with cpu_int4
    assert patched(torch.bfloat16, 128, 64) == ("vec" if chosen == "amx" else chosen)
    assert patched(torch.float32, 128, 64) == original(torch.float32, 128, 64)  # amx is bf16 only


def test_wna16_kernel_declines_only_where_its_op_is_missing():
    import torch

    from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.scalar_type import scalar_types

    from vllm_edge.patches import wna16_missing_op

    patches.load_all()
    assert wna16_missing_op.PATCH.state is State.APPLIED
    original = wna16_missing_op.PATCH.original
    fits = MPLinearLayerConfig((576, 1536), (576, 1536), scalar_types.uint4b8, torch.bfloat16, 64, False)
    odd = MPLinearLayerConfig((576, 1536), (576, 1536), scalar_types.uint8, torch.bfloat16, 64, False)
    assert original(fits) == (True, None)  # upstream offers the kernel on every CPU
    if wna16_missing_op.op_present():
        assert CPUWNA16LinearKernel.can_implement(fits) == (True, None)
        assert CPUWNA16LinearKernel.can_implement(odd) == original(odd)
    else:  # the AVX2 build: declined, naming the op and the way out
        ok, reason = CPUWNA16LinearKernel.can_implement(fits)
        assert not ok and "cpu_gemm_wna16" in reason and "cpu_int4" in reason
