"""bench startup's arithmetic on recorded timelines: offsets from process start, summed
calls, the part of LLM() no phase covers, medians over passes; the checkout each arm runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vllm_edge.bench import startup


def _rec(name, start, end, pid=1, rss=None):
    return {"name": name, "start": 100 + start, "end": 100 + end, "pid": pid,
            "rss_anon_kb": rss}


def _records(shift=0.0):
    return [_rec("interpreter", 0, 0.1), _rec("import vllm", 1, 4 + shift, rss=300 * 1024),
            _rec("LLM()", 4 + shift, 12 + shift), _rec("engine config", 4 + shift, 5 + shift),
            _rec("hf config read", 4.2, 4.3), _rec("hf config read", 4.5, 4.7),
            _rec("engine core", 5 + shift, 11 + shift, rss=700 * 1024),
            _rec("first token", 12.5 + shift, 13 + shift)]


def test_phases_from_process_start():
    ph = startup.phases(_records())
    assert ph["import vllm"]["offset_s"] == 1 and ph["import vllm"]["seconds"] == 3
    assert ph["hf config read"]["calls"] == 2 and ph["hf config read"]["seconds"] == pytest.approx(0.3)
    assert ph["engine core"]["rss_anon_mb"] == 700
    assert ph["LLM() other"]["seconds"] == pytest.approx(8 - 1 - 6)
    assert ph["first token"]["from_start_s"] == 13


def test_medians_over_passes_and_order():
    s = startup.summarize([{"records": _records(x), "wall_s": 14 + x,
                            "result": {"ready_s": 12 + x, "peak_tree_rss_anon_mb": 800,
                                       "peak_processes": 1}} for x in (0.0, 1.0, 2.0)])
    assert s["ready_s_median"] == 13 and s["first_token_from_start_s_median"] == 14
    assert s["phases"]["import vllm"]["seconds_median"] == 4
    assert (s["phases"]["import vllm"]["seconds_min"], s["phases"]["import vllm"]["seconds_max"]) == (3, 5)
    names = list(s["phases"])
    assert names.index("interpreter") < names.index("import vllm") < names.index("LLM()") < \
        names.index("first token")
    assert "LLM()" in startup.format_table({**s, "phases": s["phases"]})


def test_a_timeline_without_the_run_is_named():
    with pytest.raises(startup.StartupError, match="interpreter"):
        startup.phases([_rec("LLM()", 0, 1)])


def test_each_arm_records_the_checkout_it_runs(tmp_path):
    from vllm_edge.common.provenance import repo_sha

    here = startup.arm_source({})
    assert Path(here["path"]).name == "vllm_edge" and here["git"] == repo_sha(Path(here["path"]))
    # another checkout's source through PYTHONPATH, at its own commit
    other = tmp_path / "src" / "vllm_edge"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert startup.arm_source({"PYTHONPATH": str(tmp_path / "src")}) == {"path": str(other), "git": sha}
    (other / "__init__.py").write_text("# changed\n")
    assert startup.arm_source({"PYTHONPATH": str(tmp_path / "src")})["git"] == sha + "-dirty"


def test_the_run_guide_table_names_each_arms_commit(tmp_path):
    import json

    from vllm_edge.bench.report import guide_tables

    passes = [{"result": {"ready_s": 9.0 + i, "peak_tree_rss_anon_mb": 650.0, "peak_processes": 1},
               "records": _records(), "wall_s": 14.0} for i in range(2)]
    arm = {**startup.summarize(passes), "runs": [{**p, "loadavg": 1.0} for p in passes],
           "met": {"ready_s": False, "peak_tree_rss_anon_mb": False}}
    art = {"benchmark": "startup", "passes": 2, "model": "default", "arms": {
        "before": {**arm, "env": {"PYTHONPATH": "/tmp/old/src"}, "source": {"path": "/tmp/old/src/vllm_edge",
                                                                            "git": "abc1234def"}},
        "after": {**arm, "env": {}, "source": {"path": "/x", "git": "0123456789-dirty"}},
        "older": {**arm, "env": {}},
        "elsewhere": {**arm, "env": {"PYTHONPATH": "/tmp/wt-x/src", "VLLM_EDGE_GC_FREEZE": "0"}}}}
    (tmp_path / "startup").mkdir()
    (tmp_path / "startup" / "a.json").write_text(json.dumps(art))
    text = guide_tables.render_startup(tmp_path, tmp_path / "run.md")
    # a checkout on the measuring host is named by its commit, never by its path
    assert "| before | `PYTHONPATH=<checkout at abc1234>` | `abc1234` | 9.5 s (9.0–10.0) |" in text
    assert "| after | – | `0123456` (dirty) |" in text and "| older | – | – |" in text
    assert "| elsewhere | `PYTHONPATH=<another checkout>`, `VLLM_EDGE_GC_FREEZE=0` | – |" in text
    assert "/tmp/" not in text
