"""The C++ op ``vllm_edge::int4_gemv`` (quant/csrc/int4_op.cpp, quant/native_op.py): the same
C product as ``native.gemv``, so the same bits; which layers call it; that a compiled graph
calls it as an opaque op; and that every way it can be missing leaves the Python op."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from support.int4_weights import packed_weights
from vllm_edge.quant import native, native_op, ops, pack
from vllm_edge.quant.config import CpuInt4Config

SHAPES = [(960, 576, 32), (1536, 576, 64), (576, 1536, 128)]  # SmolLM2's qkv, gate_up at g64, down


def _op(*args):
    return torch.ops.vllm_edge.int4_gemv.default(*args)


@pytest.mark.parametrize("n,k,group", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_bit_identical_to_native_gemv_and_the_python_op(native_op_loaded, n, k, group, rows):
    p, sz, kg = packed_weights(n, k, group)[:3]
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    got = _op(x, p, sz, kg)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    assert torch.equal(got, native.gemv(x, p, sz, kg))
    assert torch.equal(got, ops.int4_linear(x, p, sz, kg, ops.AUTO))


def test_leading_dims_strides_and_empty_batches(native_op_loaded):
    p, sz, kg = packed_weights(960, 576, 32)[:3]
    x = torch.randn(2, 3, 576, dtype=torch.bfloat16)
    assert torch.equal(_op(x, p, sz, kg), native.gemv(x.reshape(6, 576), p, sz, kg).view(2, 3, 960))
    wide = torch.randn(5, 1152, dtype=torch.bfloat16)[:, ::2]  # not contiguous: copied first
    assert torch.equal(_op(wide, p, sz, kg), native.gemv(wide.contiguous(), p, sz, kg))
    assert _op(torch.empty(0, 576, dtype=torch.bfloat16), p, sz, kg).shape == (0, 960)


def test_inputs_it_cannot_take_fail_clearly(native_op_loaded):
    p, sz, kg = packed_weights(960, 576, 32)[:3]
    with pytest.raises(RuntimeError, match="x must be bf16"):
        _op(torch.randn(1, 576), p, sz, kg)
    with pytest.raises(RuntimeError, match="x has K=512, the weight is N=960 in 18 groups of 32"):
        _op(torch.randn(1, 512, dtype=torch.bfloat16), p, sz, kg)
    p, sz, kg = packed_weights(112, 256, 64)[:3]  # a 48-row tail block: the product refuses it
    with pytest.raises(RuntimeError, match="refused N=112"):
        _op(torch.randn(1, 256, dtype=torch.bfloat16), p, sz, kg)


def test_python_fallback_is_registered_and_matches(native_op_loaded):
    """Where the C++ kernel is not loaded the op runs the Python op's routes, so a graph that
    names it (compiled by a process that had the kernel) still runs."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vllm_edge::int4_gemv", "CompositeExplicitAutograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vllm_edge::int4_gemv", "CPU")
    p, sz, kg = packed_weights(960, 576, 32)[:3]
    x = torch.randn(3, 576, dtype=torch.bfloat16)
    assert torch.equal(ops._int4_gemv_fallback(x, p, sz, kg), _op(x, p, sz, kg))


_FALLBACK_PROBE = """
import json, torch
from support.int4_weights import packed_weights
from vllm_edge.quant import native, native_op, ops
ops.register()
p, sz, kg = packed_weights(960, 576, 32)[:3]
x = torch.randn(3, 576, dtype=torch.bfloat16)
ref = ops.int4_linear(x, p, sz, kg, ops.AUTO)
calls = []
gemv = native.gemv
native.gemv = lambda *a, **kw: calls.append(1) or gemv(*a, **kw)
out = torch.ops.vllm_edge.int4_gemv(x, p, sz, kg)
print(json.dumps({"loaded": native_op.load(), "state": native_op.state(), "python_calls": len(calls),
                  "equal": torch.equal(out, ref)}))
"""


def test_switch_off_in_a_fresh_process_runs_the_python_fallback():
    env = {**os.environ, "VLLM_EDGE_INT4_NATIVE_OP": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _FALLBACK_PROBE], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["loaded"] is False and got["state"] == "off (VLLM_EDGE_INT4_NATIVE_OP=0)"
    assert got["python_calls"] == 1 and got["equal"]  # the op exists and ran the Python routes


# --- which layers call it --------------------------------------------------------------

def _layer(n, k, group, **cfg_kw):
    from vllm.model_executor.layers.linear import ReplicatedLinear

    w = torch.randn(n, k) * 0.05
    q, s, z = pack.quantize(w, group)
    p = pack.pack_nibbles(q)
    layer = ReplicatedLinear(k, n, bias=False, quant_config=CpuInt4Config(group_size=group, **cfg_kw),
                             prefix="model.layers.0.mlp.down_proj", params_dtype=torch.bfloat16)
    for name, t in {"weight_packed": p, "weight_scale": s, "weight_zero": z}.items():
        param = getattr(layer, name)
        param.weight_loader(param, t)
    layer.quant_method.process_weights_after_loading(layer)
    return layer, pack.dequantize_plain(p, s, z, group)


class _OpCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Names of the ops dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _calls(layer, x) -> list[str]:
    with _OpCalls() as mode:
        layer(x)
    return mode.names


def test_a_fitting_layer_calls_the_cpp_kernel(native_op_loaded, vllm_dist, monkeypatch):
    """Fails if the layer is disconnected from the C++ kernel: through the Python op or the
    Python fallback, native.gemv would run."""
    layer, ref = _layer(960, 576, 32)
    assert layer.cpu_int4_native_op is True
    python = []
    monkeypatch.setattr(native, "gemv", lambda *a, **kw: python.append(a))
    for rows in (1, 17, 512):
        x = torch.randn(rows, 576, dtype=torch.bfloat16)
        assert _calls(layer, x) == ["vllm_edge.int4_gemv.default"]
        out = layer(x)[0]
        expect = x.float() @ ref.t()
        assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()
    assert python == []


def test_profiler_names_the_product(native_op_loaded, vllm_dist):
    from torch.profiler import ProfilerActivity, profile

    layer, _ = _layer(960, 576, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(torch.randn(2, 576, dtype=torch.bfloat16))
    names = {e.key for e in prof.key_averages()}
    assert {"vllm_edge::int4_gemv", "edge_int4_product"} <= names  # `bench profile`'s name kept
    assert "vllm::edge_cpu_int4_linear" not in names


@pytest.mark.parametrize("why,n,k,group,cfg", [
    ("integer threshold: routed by row count", 960, 576, 32, {"dequant_threshold": 48}),
    ("a plain copy is kept", 960, 576, 32, {"direct_dequant": False}),
    ("N=112 ends in a 48-row tail block", 112, 256, 64, {}),
])
def test_other_layers_keep_the_python_op(native_op_loaded, vllm_dist, why, n, k, group, cfg):
    layer, _ = _layer(n, k, group, **cfg)
    assert layer.cpu_int4_native_op is False, why
    x = torch.randn(3, k, dtype=torch.bfloat16)
    assert _calls(layer, x) == ["vllm.edge_cpu_int4_linear.default"]


def test_prefill_dequant_off_calls_the_cpp_kernel(native_op_loaded, vllm_dist):
    """NEVER dequantize: the product at every batch size, like "auto" here."""
    layer, _ = _layer(960, 576, 32, prefill_dequant=False)
    assert layer.cpu_int4_native_op is True


@pytest.fixture
def fresh_load():
    """``native_op.load`` re-evaluated inside the test and again after it."""
    native_op.load.cache_clear()
    yield
    native_op.load.cache_clear()


def test_switch_off_keeps_the_python_op(native_op_loaded, vllm_dist, monkeypatch, fresh_load):
    monkeypatch.setenv("VLLM_EDGE_INT4_NATIVE_OP", "0")
    layer, _ = _layer(960, 576, 32)
    assert layer.cpu_int4_native_op is False
    assert _calls(layer, torch.randn(3, 576, dtype=torch.bfloat16)) == ["vllm.edge_cpu_int4_linear.default"]
    assert native_op.state() == "off (VLLM_EDGE_INT4_NATIVE_OP=0)"
    assert ops.describe()["native_op"] == "off (VLLM_EDGE_INT4_NATIVE_OP=0)"


def test_a_failed_build_keeps_the_python_op(native_op_loaded, vllm_dist, monkeypatch, tmp_path, fresh_load,
                                            caplog):
    def fail(cc, cxx, out):
        raise subprocess.CalledProcessError(1, [cxx], stderr="int4_op.cpp:1: error: no torch headers")

    monkeypatch.setattr(native_op, "cached_path", lambda cc, cxx: tmp_path / "int4op-x.so")
    monkeypatch.setattr(native_op, "build", fail)
    with caplog.at_level(logging.WARNING, logger="vllm_edge.quant"):
        layer, ref = _layer(960, 576, 32)
    assert layer.cpu_int4_native_op is False
    assert native_op.state().startswith("failed: int4_op.cpp:1: error: no torch headers")
    assert "keep the Python op" in caplog.text
    x = torch.randn(3, 576, dtype=torch.bfloat16)
    out = layer(x)[0]
    assert (out.float() - x.float() @ ref.t()).abs().max() <= 0.01 * (x.float() @ ref.t()).abs().max()


def test_no_compiler_keeps_the_python_op(native_op_loaded, vllm_dist, monkeypatch, fresh_load):
    monkeypatch.setattr(native_op, "cxx_compiler", lambda: None)
    layer, _ = _layer(960, 576, 32)
    assert layer.cpu_int4_native_op is False
    assert native_op.state() == "unavailable: no C and C++ compiler found"


def test_without_the_product_nothing_is_built(vllm_dist, monkeypatch, fresh_load):
    monkeypatch.setattr(native, "gemv_supported", lambda: False)
    monkeypatch.setattr(native_op, "build", lambda *a: pytest.fail("built without a product to call"))
    layer, _ = _layer(960, 576, 32)
    assert layer.cpu_int4_native_op is False
    assert native_op.state() == "not used: the native product does not run here"


def test_the_cache_key_follows_torch_and_the_flags(monkeypatch):
    cc, cxx = native._compiler(), native_op.cxx_compiler()
    if cc is None or cxx is None:
        pytest.skip("no compiler")
    base = native_op.cached_path(cc, cxx)
    assert base.parent.name == "kernels" and base.name.startswith("int4op-")
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert native_op.cached_path(cc, cxx) != base
    monkeypatch.undo()
    monkeypatch.setattr(native_op, "FLAGS", ["-O2"])
    assert native_op.cached_path(cc, cxx) != base


# --- the compiled graph ----------------------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0] * 2


def test_compiled_graph_calls_the_op_opaquely(native_op_loaded, vllm_dist):
    """Dynamo records one call of the op per layer (not traced into), one graph for every
    row count; Inductor's code calls it and gives the eager bits."""
    import torch._dynamo as dynamo

    layer, _ = _layer(960, 576, 32)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    block = _Block(layer)
    dynamo.reset()
    recorded = torch.compile(block, backend=record, dynamic=True, fullgraph=True)
    for rows in (3, 17, 64):
        x = torch.randn(rows, 576, dtype=torch.bfloat16)
        assert torch.equal(recorded(x), block(x))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count("vllm_edge.int4_gemv.default") == 1
    assert not any("edge_cpu_int4_linear" in t for t in targets)

    dynamo.reset()
    compiled = torch.compile(block, dynamic=True, fullgraph=True)  # Inductor
    for rows in (3, 17):
        x = torch.randn(rows, 576, dtype=torch.bfloat16)
        assert torch.equal(compiled(x), block(x))
    dynamo.reset()
