"""The grid's judgement, pinned with fake arms (no engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_edge.bench.grid import runner as grid
from vllm_edge.common import stats
from vllm_edge.common.atomic import write_json


def _records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines()]


def test_rotation_helper():
    assert [grid.rotation(3, k) for k in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_arm_order_rotates_every_pass(fake_arm, grid_kwargs):
    arms = [fake_arm(n, [{"ready_s": 1.0}]) for n in ("a", "b", "c")]
    summary = grid.run_grid({"name": "rot", "arms": arms}, passes=3, **grid_kwargs)
    ran = [e["arm"] for e in fake_arm.log()]
    assert ran == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [p["order"] for p in summary["pass_meta"]] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    recs = _records(grid_kwargs["out_dir"])
    assert [(r["pass"], r["position"], r["arm"]) for r in recs][3:6] == [(1, 0, "b"), (1, 1, "c"), (1, 2, "a")]


def test_cache_root_distinct_per_arm_and_warm_across_passes(fake_arm, grid_kwargs):
    arms = [fake_arm("x", [{"ready_s": 1.0}]), fake_arm("y", [{"ready_s": 1.0}]),
            fake_arm("shared", [{"ready_s": 1.0}], env={"VLLM_CACHE_ROOT": str(grid_kwargs["work_dir"] / "mine")})]
    summary = grid.run_grid({"arms": arms}, passes=2, **grid_kwargs)
    log = fake_arm.log()
    roots = {e["arm"]: e["cache_root"] for e in log}
    assert len(set(roots.values())) == 3
    assert roots["shared"] == str(grid_kwargs["work_dir"] / "mine")  # an arm may opt into its own root
    assert roots["x"] == summary["cache_roots"]["x"]
    assert all(Path(r).is_relative_to(grid_kwargs["work_dir"]) for r in roots.values())
    # First pass cold, second warm, for every arm: nothing leaks between arms.
    for arm in ("x", "y", "shared"):
        assert [e["warm"] for e in log if e["arm"] == arm] == [False, True]
    recs = _records(grid_kwargs["out_dir"])
    assert [r["cache_cold"] for r in recs if r["arm"] == "x"] == [True, False]


def test_metrics_from_last_json_line_and_direction_aware_best(fake_arm, grid_kwargs):
    arms = [
        fake_arm("a", [{"ready_s": 3.0, "tg_tps": 10.0, "nested": {"peak_mb": 7.0}, "ok": True},
                       {"ready_s": 1.0, "tg_tps": 30.0, "nested": {"peak_mb": 5.0}, "ok": True},
                       {"ready_s": 2.0, "tg_tps": 20.0, "nested": {"peak_mb": 6.0}, "ok": True}]),
    ]
    s = grid.run_grid({"arms": arms}, passes=3, **grid_kwargs)
    assert s["metrics"]["ready_s"]["arms"]["a"]["best"] == 1.0
    assert s["metrics"]["tg_tps"]["arms"]["a"]["best"] == 30.0
    assert s["metrics"]["nested.peak_mb"]["arms"]["a"]["best"] == 5.0
    assert s["metrics"]["tg_tps"]["arms"]["a"]["median"] == 20.0
    assert "ok" not in s["metrics"]  # booleans are not metrics


def test_not_a_ranking_vs_clear_leader(fake_arm, grid_kwargs):
    arms = [fake_arm("slow", [{"ready_s": 2.0, "tg_tps": 10.0}, {"ready_s": 2.1, "tg_tps": 12.0},
                              {"ready_s": 2.05, "tg_tps": 11.0}]),
            fake_arm("fast", [{"ready_s": 1.0, "tg_tps": 11.5}, {"ready_s": 1.1, "tg_tps": 13.0},
                              {"ready_s": 1.05, "tg_tps": 12.5}])]
    s = grid.run_grid({"arms": arms}, passes=3, **grid_kwargs)
    tps = s["metrics"]["tg_tps"]
    assert tps["ranking"]["flags"] == [stats.NOT_A_RANKING]
    assert stats.NOT_A_RANKING in tps["arms"]["fast"]["flags"]
    ready = s["metrics"]["ready_s"]["ranking"]
    assert ready["leader"] == "fast" and ready["flags"] == []
    text = grid.format_summary(s)
    assert "NOT A RANKING" in text and "leader: fast" in text


def test_single_pass_and_noisy_flags(fake_arm, grid_kwargs):
    s1 = grid.run_grid({"arms": [fake_arm("one", [{"ready_s": 1.0}])]}, passes=1, **grid_kwargs)
    assert s1["metrics"]["ready_s"]["arms"]["one"]["flags"] == [stats.SINGLE_PASS]
    s2 = grid.run_grid({"arms": [fake_arm("jumpy", [{"ready_s": 1.0}, {"ready_s": 2.0}, {"ready_s": 1.2}])]},
                       passes=3, **grid_kwargs)
    summ = s2["metrics"]["ready_s"]["arms"]["jumpy"]
    assert stats.NOISY in summ["flags"] and summ["spread_pct"] == pytest.approx(100 / 1.2, rel=1e-3)


def test_failed_runs_are_kept_with_stderr_tail(fake_arm, grid_kwargs):
    arms = [fake_arm("flaky", [{"ready_s": 1.0}, "fail", "nojson"]), fake_arm("dead", ["fail"])]
    s = grid.run_grid({"arms": arms}, passes=3, **grid_kwargs)
    recs = _records(grid_kwargs["out_dir"])
    failed = [r for r in recs if not r["ok"]]
    assert len(recs) == 6 and len(failed) == 5
    crash = next(r for r in failed if r["arm"] == "flaky" and r["returncode"] == 3)
    assert "Traceback: something broke in flaky" in crash["stderr_tail"]
    assert crash["error"] == "exit code 3"
    nojson = next(r for r in failed if r["arm"] == "flaky" and r["returncode"] == 0)
    assert nojson["error"] == "no JSON object line on stdout"
    assert s["runs"]["flaky"] == {"ok": 1, "failed": 2, "busy": 0}
    assert s["runs"]["dead"]["ok"] == 0
    assert s["metrics"]["ready_s"]["arms"]["flaky"]["n"] == 1
    assert s["metrics"]["ready_s"]["arms"]["dead"]["flags"] == ["no successful run"]


def test_summary_carries_provenance(fake_arm, grid_kwargs):
    s = grid.run_grid({"arms": [fake_arm("a", [{"ready_s": 1.0}])], "threads": 2}, passes=1, **grid_kwargs)
    on_disk = json.loads((grid_kwargs["out_dir"] / "summary.json").read_text())
    prov = on_disk["provenance"]
    for key in ("timestamp", "host", "cpu", "core_set", "threads", "loadavg", "versions", "build",
                "env", "model", "target_cores"):
        assert key in prov, key
    assert prov["threads"] == 2
    assert prov["versions"]["torch"] and prov["versions"]["python"]
    assert on_disk["cores"] == s["cores"] == sorted(os.sched_getaffinity(0))


# --- contention guard ---------------------------------------------------------

def test_busy_preflight_refuses_before_any_run(fake_arm, grid_kwargs):
    kw = dict(grid_kwargs, sampler=lambda cores, s: {c: 95.0 for c in cores})
    with pytest.raises(grid.HostBusy, match="busy"):
        grid.run_grid({"arms": [fake_arm("a", [{"ready_s": 1.0}])]}, passes=2, **kw)
    assert fake_arm.log() == []


def test_allow_busy_marks_passes(fake_arm, grid_kwargs):
    samples = iter([{0: 95.0}, {0: 1.0}, {0: 60.0}])
    kw = dict(grid_kwargs, sampler=lambda cores, s: next(samples), cores=[0], allow_busy=True)
    s = grid.run_grid({"arms": [fake_arm("a", [{"ready_s": 1.0}])]}, passes=3, **kw)
    assert [r["busy"] for r in _records(grid_kwargs["out_dir"])] == [True, False, True]
    assert s["busy_passes"] == [0, 2]
    assert s["runs"]["a"]["busy"] == 2


def test_real_sampler_sees_a_busy_core():
    core = sorted(os.sched_getaffinity(0))[0]
    hog = subprocess.Popen([sys.executable, "-c",
                            f"import os,time; os.sched_setaffinity(0, [{core}]); t=time.time()\n"
                            "while time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)
        busy = grid.sample_cpu_busy([core], seconds=0.5)
    finally:
        hog.kill()
        hog.wait()
    assert busy[core] > 50.0
    assert grid.contention([core], 50.0, sampler=lambda c, s: busy)["busy"]


# --- host lock ----------------------------------------------------------------

def test_host_lock_names_the_holder(fake_arm, grid_kwargs):
    with grid.HostLock(grid_kwargs["lock_path"]):
        with pytest.raises(grid.LockHeld) as exc:
            grid.run_grid({"arms": [fake_arm("a", [{"ready_s": 1.0}])]}, passes=1, **grid_kwargs)
        assert f"pid {os.getpid()}" in str(exc.value)
    assert fake_arm.log() == []
    # Released: the grid can take it now.
    grid.run_grid({"arms": [fake_arm("a", [{"ready_s": 1.0}])]}, passes=1, **grid_kwargs)


# --- regression gate ------------------------------------------------------------

def _summary(values: dict[str, dict[str, list[float]]]) -> dict:
    recs = [{"arm": arm, "ok": True, "metrics": {m: v}} for arm, ms in values.items()
            for m, vs in ms.items() for v in vs]
    return grid.summarize_runs(recs, list(values))


def test_gate_statuses():
    expected = {"arms": {"a": {
        "ready_s": {"median": 10.0, "spread_pct": 4.0},       # lower is better
        "load_s": {"median": 10.0, "spread_pct": 4.0},
        "peak_mb": {"median": 100.0, "spread_pct": 2.0},
        "top1_agreement": {"median": 0.90, "spread_pct": 1.0},  # higher is better
        "tg_tps": {"median": 50.0, "spread_pct": 3.0},
        "pid": {"median": 1.0, "spread_pct": 0.0},
        "gone_s": {"median": 1.0, "spread_pct": 0.0}}}}
    cur = _summary({"a": {"ready_s": [10.2, 10.3, 10.4], "load_s": [12.0, 12.1, 12.2],
                          "peak_mb": [80.0, 80.5, 81.0], "top1_agreement": [0.80, 0.80, 0.81],
                          "tg_tps": [5.0, 5.1, 5.2], "pid": [7.0]}})
    res = grid.check(cur, expected)
    status = {r["metric"]: r["status"] for r in res["rows"]}
    assert status == {"ready_s": "ok", "load_s": "regressed", "peak_mb": "improved",
                      "top1_agreement": "regressed", "tg_tps": grid.THROUGHPUT_UNGATED,
                      "pid": "ungated (metric name has no direction)", "gone_s": "regressed"}
    assert res["regressed"]


def test_gate_band_widens_with_observed_spread():
    expected = {"arms": {"a": {"ready_s": {"median": 10.0, "spread_pct": 2.0}}}}
    tight = grid.check(_summary({"a": {"ready_s": [10.9, 11.0, 11.1]}}), expected)
    assert tight["rows"][0]["status"] == "regressed"  # 5% floor band: 11.0 > 10.5
    loose = grid.check(_summary({"a": {"ready_s": [9.0, 11.0, 12.0]}}), expected)
    assert loose["rows"][0]["status"] == "ok"  # 27% observed spread widens the band
    explicit = {"arms": {"a": {"ready_s": {"median": 10.0, "tolerance_pct": 50.0}}}}
    assert grid.check(_summary({"a": {"ready_s": [14.0, 14.0]}}), explicit)["rows"][0]["status"] == "ok"


def test_throughput_never_fails_the_gate():
    expected = {"arms": {"a": {"tg_tps": {"median": 100.0, "spread_pct": 1.0}}}}
    res = grid.check(_summary({"a": {"tg_tps": [1.0, 1.0]}}), expected)
    assert not res["regressed"] and res["rows"][0]["status"].startswith("ungated")


# --- the command line -------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_edge.cli", "grid", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_end_to_end_with_gate(fake_arm, tmp_path):
    spec = tmp_path / "spec.json"
    write_json(spec, {"name": "cli", "arms": [fake_arm("a", [{"ready_s": 1.0}, {"ready_s": 1.02}]),
                                              fake_arm("b", [{"ready_s": 2.0}, {"ready_s": 2.04}])]})
    common = ["--passes", "2", "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w"),
              "--lock-file", str(tmp_path / "l.lock"), "--allow-busy"]
    exp = tmp_path / "exp.json"
    r = _cli(str(spec), *common, "--write-expectations", str(exp))
    assert r.returncode == 0, r.stderr
    assert "leader: a" in r.stdout
    assert json.loads(exp.read_text())["arms"]["b"]["ready_s"]["median"] == pytest.approx(2.02)
    # Same values again (counters continue: 3rd and 4th run repeat the pattern): gate passes.
    r = _cli(str(spec), *common, "--check", str(exp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ready_s" in r.stdout and ": ok" in r.stdout
    # Tighten the expectation for b far below what it does: regression, exit 1.
    data = json.loads(exp.read_text())
    data["arms"]["b"]["ready_s"] = {"median": 1.0, "spread_pct": 1.0}
    write_json(exp, data)
    r = _cli(str(spec), *common, "--check", str(exp))
    assert r.returncode == grid.EXIT_REGRESSION
    assert "regressed" in r.stdout
    check = json.loads((tmp_path / "out" / "summary.json").read_text())["check"]
    assert check["regressed"] is True


def test_cli_refuses_a_busy_host(fake_arm, tmp_path):
    spec = tmp_path / "spec.json"
    write_json(spec, {"arms": [fake_arm("a", [{"ready_s": 1.0}])]})
    # A negative threshold makes any sample "busy": the refusal path, deterministically.
    r = _cli(str(spec), "--passes", "1", "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w"),
             "--lock-file", str(tmp_path / "l.lock"), "--busy-threshold", "-1")
    assert r.returncode == grid.EXIT_BUSY
    assert "busy" in r.stderr and "--allow-busy" in r.stderr
    assert fake_arm.log() == []


def test_cli_bad_spec_and_dead_arm(fake_arm, tmp_path):
    bad = tmp_path / "bad.json"
    write_json(bad, {"arms": [{"name": "x", "cmd": "not a list"}]})
    r = _cli(str(bad), "--lock-file", str(tmp_path / "l.lock"))
    assert r.returncode == grid.EXIT_SPEC and "argv list" in r.stderr
    spec = tmp_path / "spec.json"
    write_json(spec, {"arms": [fake_arm("dead", ["fail"])]})
    r = _cli(str(spec), "--passes", "1", "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w"),
             "--lock-file", str(tmp_path / "l.lock"), "--allow-busy")
    assert r.returncode == grid.EXIT_ARM_FAILED
    assert "failed run" in r.stdout


def test_warmup_runs_each_arm_once_first_and_is_not_summarized(fake_arm, grid_kwargs):
    # The warm-up run reports a wild value; if it leaked into the summary, best would be 100.
    arms = [fake_arm(n, [{"ready_s": 100.0}, {"ready_s": 2.0}, {"ready_s": 3.0}]) for n in ("a", "b")]
    summary = grid.run_grid({"name": "wu", "arms": arms}, passes=2, warmup=True, **grid_kwargs)
    log = fake_arm.log()
    assert [e["arm"] for e in log] == ["a", "b", "a", "b", "b", "a"]
    assert [e["warm"] for e in log if e["arm"] == "a"] == [False, True, True]
    for arm in ("a", "b"):
        got = summary["metrics"]["ready_s"]["arms"][arm]
        assert got["n"] == 2 and got["best"] == 2.0
    recs = _records(grid_kwargs["out_dir"])
    assert [r.get("warmup", False) for r in recs] == [True, True, False, False, False, False]
    assert summary["warmup"] is True and summary["warmup_failed"] == []


# --- A/B pairs ------------------------------------------------------------------

def test_pairs_are_judged_on_their_own(fake_arm, grid_kwargs):
    # Four arms, two levers: the overall ranking compares "int4 *" only; each pair gets its verdict.
    arms = [fake_arm("bf16 a", [{"tg_tps": 40.0}, {"tg_tps": 41.0}, {"tg_tps": 42.0}]),
            fake_arm("bf16 b", [{"tg_tps": 50.0}, {"tg_tps": 51.0}, {"tg_tps": 52.0}]),
            fake_arm("int4 a", [{"tg_tps": 80.0}, {"tg_tps": 85.0}, {"tg_tps": 90.0}]),
            fake_arm("int4 b", [{"tg_tps": 82.0}, {"tg_tps": 86.0}, {"tg_tps": 88.0}])]
    spec = {"arms": arms, "pairs": [["bf16 a", "bf16 b"], ["int4 a", "int4 b"]]}
    s = grid.run_grid(spec, passes=3, **grid_kwargs)
    assert s["metrics"]["tg_tps"]["ranking"]["order"][:2] == ["int4 b", "int4 a"]
    bf16, int4 = s["pairs"]
    assert (bf16["a"], bf16["b"]) == ("bf16 a", "bf16 b")
    assert bf16["metrics"]["tg_tps"]["ranking"]["leader"] == "bf16 b"
    assert bf16["metrics"]["tg_tps"]["b_over_a"] == pytest.approx(51.0 / 41.0, abs=1e-4)
    assert int4["metrics"]["tg_tps"]["ranking"]["flags"] == [stats.NOT_A_RANKING]
    # Judging a pair does not add flags to the overall per-arm summaries.
    assert stats.NOT_A_RANKING not in s["metrics"]["tg_tps"]["arms"]["bf16 b"]["flags"]
    text = grid.format_summary(s)
    assert "pair bf16 a -> bf16 b:" in text and "leader: bf16 b" in text


@pytest.mark.parametrize("pairs, msg", [
    ([["a", "nope"]], "no arm named 'nope'"),
    ([["a", "a"]], "two distinct arm names"),
    ([["a"]], "two distinct arm names"),
    ("a,b", "must be a list"),
])
def test_bad_pairs_are_spec_errors(pairs, msg):
    arms = [{"name": "a", "cmd": ["python", "x"]}, {"name": "b", "cmd": ["python", "x"]}]
    with pytest.raises(grid.SpecError, match=msg):
        grid.load_spec({"arms": arms, "pairs": pairs})


def test_the_rmsnorm_spec_parses_with_one_cache_per_arm_and_one_lever_per_pair():
    spec = grid.load_spec(Path(__file__).resolve().parents[2] / "benchmarks" / "specs" / "rmsnorm.json")
    arms = {a.name: a for a in spec["arms"]}
    assert len(arms) == 4 and len(spec["pairs"]) == 2
    for a, b in spec["pairs"]:
        # Only the provider switch differs inside a pair.
        assert arms[a].cmd == arms[b].cmd
        assert arms[a].env == {"VLLM_EDGE_RMSNORM_PROVIDER": "0"}
        assert arms[b].env == {"VLLM_EDGE_RMSNORM_PROVIDER": "1"}
        assert "VLLM_CACHE_ROOT" not in arms[a].env  # the grid gives each arm its own


def test_on_record_sees_every_run_as_written(fake_arm, grid_kwargs):
    seen = []

    def on_record(rec):
        # The record is already in results.jsonl when the callback runs.
        seen.append((rec["arm"], rec["pass"], len(_records(grid_kwargs["out_dir"]))))

    arms = [fake_arm("a", [{"ready_s": 1.0}]), fake_arm("b", ["fail"])]
    grid.run_grid({"arms": arms}, passes=2, on_record=on_record, **grid_kwargs)
    assert seen == [("a", 0, 1), ("b", 0, 2), ("b", 1, 3), ("a", 1, 4)]


def test_an_argument_under_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    arm = grid.Arm("echo", ["python", "-c", "import sys, json; print(json.dumps({'n': len(sys.argv[1])}));"
                            "open(sys.argv[1]).close()", "~/file.txt"], {})
    (tmp_path / "file.txt").write_text("x")
    rec = grid.run_arm(arm, tmp_path / "cache", None, 60)
    assert rec["ok"], rec.get("stderr_tail")
    assert rec["metrics"]["n"] == len(str(tmp_path / "file.txt"))
