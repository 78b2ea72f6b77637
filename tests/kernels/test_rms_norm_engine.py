"""On the real engine (one process, eager): the provider is dispatched for every
norm when opted in, and never in the default state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
PROBE = Path(__file__).parents[1] / "support" / "rmsnorm_engine_probe.py"


def _probe(model_dir: Path, switch: str) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_EDGE_RMSNORM_PROVIDER": switch}
    proc = subprocess.run([sys.executable, str(PROBE), str(model_dir)], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(default_model_dir):
    return {"default": _probe(default_model_dir, "0"), "opted_in": _probe(default_model_dir, "1")}


def test_default_state_dispatches_native(runs):
    r = runs["default"]
    assert r["engine_kwargs_priority"] is None
    assert r["config_priority"] == {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]}
    assert r["worker"]["ir_priority"]["rms_norm"] == ["native"]
    assert r["worker"]["ir_priority"]["fused_add_rms_norm"] == ["native"]
    # Registered in the worker, but not selected: the kernels never ran.
    assert {"rms_norm:edge_cpu", "fused_add_rms_norm:edge_cpu"} <= set(r["worker"]["registrations"])
    assert r["kernel_calls"] == {"_C::rms_norm": 0, "_C::fused_add_rms_norm": 0}


def test_opted_in_state_dispatches_the_provider_for_every_norm(runs):
    r = runs["opted_in"]
    want = ["edge_cpu", "native"]
    assert r["config_priority"] == {"rms_norm": want, "fused_add_rms_norm": want}
    assert r["worker"]["ir_priority"]["rms_norm"] == want
    assert r["worker"]["ir_priority"]["fused_add_rms_norm"] == want
    calls = r["kernel_calls"]
    steps = calls["_C::rms_norm"]  # one un-fused norm per forward: layer 0's input norm
    assert steps >= 8  # 8 generated tokens: at least 8 forwards
    # Every other norm is add+norm: two per layer minus layer 0's first, plus the final norm.
    assert calls["_C::fused_add_rms_norm"] == 2 * r["num_layers"] * steps


def test_both_states_answer(runs):
    for r in runs.values():
        assert "Paris" in r["text"]
