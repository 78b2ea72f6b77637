"""`vllm-edge bench step` on the real engine: the default cpu_int4 build, eager, a short run."""

from __future__ import annotations

import json

import pytest

from support.cli_runner import run_cli
from vllm_edge.bench import step

pytestmark = pytest.mark.slow

STEPS = 6


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    out = tmp_path_factory.mktemp("step") / "s.json"
    proc = run_cli("bench", "step", "--eager", "--steps", str(STEPS), "--warmup", "2",
                   "--dispatch-calls", "20", "--out", str(out), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_every_section_was_timed_in_every_step(stepped):
    _, res = stepped
    assert res["benchmark"] == "step" and "cpu_int4" in res["build"] and res["steps"] == STEPS
    assert len(res["per_step_ms"]) == STEPS
    for row in res["per_step_ms"]:
        # every wrapper fired: a section at zero would mean a method vLLM no longer calls
        for k in ("schedule", "forward", "head", "sampler", "output", "update_from_output"):
            assert row[k] > 0, k
        assert row["forward"] < row["step"]
        assert sum(row[k] for k in step.SECTIONS) == pytest.approx(row["step"], rel=1e-3)
    assert res["engine"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_op_counts_see_the_models_ops(stepped):
    _, res = stepped
    ops = res["op_counts"]["ops"]
    layers = 30
    # four int4 linears per layer, each a Python-implemented vllm:: op unless the native op
    # serves it; the head, tied to the file's Q8_0 embedding, is the one int8 linear: packed
    # (the C++ op, or its Python fallback) where quant/lowbit.py's product runs, else row-major
    from vllm_edge.quant import lowbit

    def calls(*names):
        return sum(ops.get(n, {}).get("calls_per_step", 0) for n in names)

    assert calls("vllm::edge_cpu_int4_linear", "vllm_edge::int4_gemv") == 4 * layers
    packed = calls("vllm_edge::lowbit_linear", "vllm::edge_cpu_int8_lowbit_linear")
    rowmajor = calls("vllm::edge_cpu_int8_linear")
    assert (packed, rowmajor) == ((1, 0) if lowbit.supported() else (0, 1)), sorted(ops)
    assert res["op_counts"]["python_op_calls_per_step"] >= layers  # attention at least
    d = res["int4_dispatch"]
    assert d["layer"].startswith("model.layers.0.") and d["op_us"] > 0 and d["impl_us"] > 0


def test_last_stdout_line_is_the_grid_metric_line(stepped):
    proc, res = stepped
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "step" and line["step_ms"] == res["median_ms"]["step"]
