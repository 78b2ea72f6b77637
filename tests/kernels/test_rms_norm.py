"""The edge_cpu norm provider: registered through vLLM's IR, numerically equal to
native, refused where the kernel would be wrong, and selected only when asked."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.kernels import rms_norm as R

HIDDEN, EPS = 576, 1e-5  # the default model's hidden size; its epsilon is 1e-5 too


@pytest.fixture(scope="module")
def ir():
    from vllm import ir

    R.register()
    return ir


def _inputs(rows: int, hidden: int = HIDDEN, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, hidden, generator=g)).to(dtype)
    r = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(hidden, generator=g)).to(dtype)
    return x, r, w


def test_registered_once_supported_here_and_recorded(ir):
    from vllm_edge import plugin

    assert R.register() == R.register()
    plugin.register()
    for op in R.OPS:
        impl = getattr(ir.ops, op).impls[R.PROVIDER]
        assert impl.supported, f"{op}: the CPU build should have the _C kernel"
        regs = [r for r in plugin.registrations() if r.name == f"{op}:{R.PROVIDER}"]
        assert len(regs) == 1 and regs[0].kind == "ir_impl" and regs[0].state == "registered"
    assert ir.ops.fused_add_rms_norm.impls[R.PROVIDER].inplace


@pytest.mark.parametrize("rows", [1, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_matches_native_through_vllm_dispatch(ir, rows, dtype):
    op = ir.ops.rms_norm
    x, _, w = _inputs(rows, dtype=dtype)
    ref = op.impls["native"].impl_fn(x, w, EPS)
    with op.set_priority([R.PROVIDER, "native"]):
        assert op.dispatch(x, w, EPS).provider == R.PROVIDER
        out = op(x, w, EPS)
    # vLLM's own tolerance for IR impls against native: bf16 atol 1e-3, rtol 1.6e-2.
    torch.testing.assert_close(out, ref, **op.get_tolerance(dtype))
    assert out.shape == x.shape and out.dtype == dtype
    no_w = op.impls[R.PROVIDER].impl_fn(x, None, EPS)
    torch.testing.assert_close(no_w, op.impls["native"].impl_fn(x, None, EPS), **op.get_tolerance(dtype))


@pytest.mark.parametrize("rows", [1, 512])
def test_fused_add_rms_norm_matches_native_in_place(ir, rows):
    op = ir.ops.fused_add_rms_norm
    x, r, w = _inputs(rows)
    ref_out, ref_res = op.impls["native"].impl_fn(x, r, w, EPS)
    xi, ri = x.clone(), r.clone()
    with op.set_priority([R.PROVIDER, "native"]):
        out, res = op.maybe_inplace(xi, ri, w, EPS)  # as RMSNorm.forward_native calls it
    tol = op.get_tolerance(torch.bfloat16)
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(res, ref_res, **tol)
    assert out.data_ptr() == xi.data_ptr() and res.data_ptr() == ri.data_ptr()  # really in place
    # The functional overload must leave its inputs alone (vLLM clones for inplace impls).
    xf, rf = x.clone(), r.clone()
    with op.set_priority([R.PROVIDER, "native"]):
        out_f, _ = op(xf, rf, w, EPS)
    assert torch.equal(xf, x) and torch.equal(rf, r)
    torch.testing.assert_close(out_f, ref_out, **tol)


def test_strided_input_goes_native_because_the_kernel_would_be_wrong(ir):
    op = ir.ops.rms_norm
    wide, _, _ = _inputs(4, hidden=2 * HIDDEN)
    x = wide[:, :HIDDEN]  # a view whose rows are not contiguous
    _, _, w = _inputs(4)
    ref = op.impls["native"].impl_fn(x, w, EPS)
    raw = torch.empty(x.shape, dtype=x.dtype)
    torch.ops._C.rms_norm(raw, x, w, EPS)
    assert not torch.allclose(raw, ref, atol=0.1), "the kernel handles strides now; relax the check"
    with op.set_priority([R.PROVIDER, "native"]):
        assert op.dispatch(x, w, EPS).provider == "native"
        torch.testing.assert_close(op(x, w, EPS), ref, **op.get_tolerance(torch.bfloat16))


@pytest.mark.parametrize("case", ["hidden_24", "hidden_17", "weight_fp32", "variance_size"])
def test_arguments_that_do_not_fit_go_native(ir, case):
    op = ir.ops.rms_norm
    hidden = {"hidden_24": 24, "hidden_17": 17}.get(case, HIDDEN)
    x, _, w = _inputs(3, hidden=hidden)
    args = [x, w.float() if case == "weight_fp32" else w, EPS]
    if case == "variance_size":
        args.append(HIDDEN // 2)
    with op.set_priority([R.PROVIDER, "native"]):
        assert op.dispatch(*args).provider == "native"
        torch.testing.assert_close(op(*args), op.impls["native"].impl_fn(*args),
                                   **op.get_tolerance(torch.bfloat16))


def test_default_state_leaves_vllm_default(monkeypatch, tmp_path, default_model_dir):
    from vllm_edge.runtime.engine import edge_engine

    monkeypatch.delenv(R.ENV_SWITCH, raising=False)
    assert R.engine_priority() is None
    edge = edge_engine(default_model_dir, max_model_len=512)
    assert "ir_op_priority" not in edge.kwargs
    d = R.describe()
    assert d["in_default_priority"] is False and d["supported"] is True
    assert d["default_priority"] == {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]}


def test_opted_in_state_puts_the_provider_first(monkeypatch, default_model_dir):
    from vllm_edge.runtime.engine import edge_engine

    monkeypatch.setenv(R.ENV_SWITCH, "1")
    want = {"rms_norm": [R.PROVIDER, "native"], "fused_add_rms_norm": [R.PROVIDER, "native"]}
    assert R.engine_priority() == want
    edge = edge_engine(default_model_dir, max_model_len=512)
    assert edge.kwargs["ir_op_priority"] == want and "ir_op_priority" in edge.reasons
    assert R.describe()["in_default_priority"] is True


def test_the_switch_is_declared_off_by_default():
    from vllm_edge import envs

    var = envs.DECLARED[R.ENV_SWITCH]
    assert var.type == "bool" and var.default is False
