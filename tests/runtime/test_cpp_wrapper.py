"""The compiled graph's C++ wrapper: which engines get it, with what, and when it stays off
(no engine started; tests/serving/test_graph_cache_engine.py checks the graph a real builder
caches)."""

from __future__ import annotations

import sys
import types

import pytest

from vllm_edge.runtime import cpp_wrapper, engine
from vllm_edge.serving import serve


@pytest.fixture(autouse=True)
def _vllm_not_imported_with_layer_names(monkeypatch):
    """As in a process that has not imported vLLM yet (other tests here may have)."""
    monkeypatch.setitem(sys.modules, "vllm.utils.torch_utils", types.SimpleNamespace(_USE_LAYERNAME=False))


def test_a_compiled_engine_gets_the_cpp_wrapper_and_string_layer_names(default_model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_EDGE_CPP_WRAPPER", raising=False)
    monkeypatch.delenv("VLLM_USE_LAYERNAME", raising=False)
    edge = engine.edge_engine(default_model_dir)
    inductor = edge.kwargs["compilation_config"]["inductor_compile_config"]
    assert inductor == {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}
    assert edge.env["VLLM_USE_LAYERNAME"] == "0"
    assert "cpp_wrapper" in edge.reasons["compilation_config"]
    # the API server gets it as vLLM's own flag
    flags = serve.vllm_flags(edge.kwargs)
    at = flags.index("--compilation-config")
    assert '"cpp_wrapper": true' in flags[at + 1]


def test_an_eager_engine_compiles_nothing_and_keeps_vllms_layer_names(default_model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_USE_LAYERNAME", raising=False)
    edge = engine.edge_engine(default_model_dir, enforce_eager=True)
    assert "compilation_config" not in edge.kwargs and "VLLM_USE_LAYERNAME" not in edge.env


def test_the_switch_keeps_the_python_wrapper(default_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_CPP_WRAPPER", "0")
    edge = engine.edge_engine(default_model_dir)
    assert "compilation_config" not in edge.kwargs and "VLLM_USE_LAYERNAME" not in edge.env
    assert edge.reasons["compilation_config"].startswith("VLLM_EDGE_CPP_WRAPPER=0")


def test_layer_names_the_user_asked_for_keep_the_python_wrapper(default_model_dir, monkeypatch):
    """Inductor's C++ wrapper cannot pass vLLM's LayerName objects; the user's choice wins."""
    monkeypatch.delenv("VLLM_EDGE_CPP_WRAPPER", raising=False)
    monkeypatch.setenv("VLLM_USE_LAYERNAME", "1")
    edge = engine.edge_engine(default_model_dir)
    assert "compilation_config" not in edge.kwargs and "VLLM_USE_LAYERNAME" not in edge.env
    assert "VLLM_USE_LAYERNAME is set on" in edge.reasons["compilation_config"]


def test_an_existing_inductor_config_is_kept_beside_it():
    kwargs = {"compilation_config": {"inductor_compile_config": {"max_autotune": False}, "mode": 3}}
    env: dict[str, str] = {}
    cpp_wrapper.apply(kwargs, env, {})
    assert kwargs["compilation_config"] == {
        "mode": 3, "inductor_compile_config": {"max_autotune": False, "cpp_wrapper": True,
                                               "cpp_wrapper_build_separate": True}}
    assert env == {"VLLM_USE_LAYERNAME": "0"}


def test_vllm_imported_with_layer_name_objects_keeps_the_python_wrapper(monkeypatch):
    """Its op schemas are fixed at import: setting the variable afterwards would not help."""
    monkeypatch.delenv("VLLM_EDGE_CPP_WRAPPER", raising=False)
    monkeypatch.delenv("VLLM_USE_LAYERNAME", raising=False)
    monkeypatch.setitem(sys.modules, "vllm.utils.torch_utils", types.SimpleNamespace(_USE_LAYERNAME=True))
    on, why = cpp_wrapper.decide()
    assert not on and "imported in this process" in why
    monkeypatch.setitem(sys.modules, "vllm.utils.torch_utils", types.SimpleNamespace(_USE_LAYERNAME=False))
    assert cpp_wrapper.decide()[0]
