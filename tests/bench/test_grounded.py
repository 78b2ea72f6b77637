"""bench grounded without an engine: the decode arithmetic, the arms' answer comparison, the
prompt set, the grid line, and the CLI's refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_edge.bench import grounded


def test_decode_rate_is_tokens_after_the_first_over_the_decode_time():
    # two prompts: 5 and 3 tokens; one rep: 1.0 - 0.2 and 0.5 - 0.1 seconds of decoding
    assert grounded.decode_tps([5, 3], [[1.0, 0.5]], [[0.2, 0.1]]) == pytest.approx([6 / 1.2])
    # a rep per row
    assert grounded.decode_tps([2], [[1.0], [2.0]], [[0.5], [1.0]]) == pytest.approx([2.0, 1.0])


def test_a_decode_no_longer_than_one_token_is_refused():
    with pytest.raises(RuntimeError, match="not usable"):
        grounded.decode_tps([5], [[0.1]], [[0.2]])


def test_the_prompt_set_has_each_copying_task_and_plain_chat():
    cats = {c for c, _ in grounded.PROMPTS}
    assert cats == {"summarise", "extract", "rewrite", "fix_code", "quote", "tool_call", "chat"}
    assert set(grounded.GROUNDED) == cats - {"chat"}
    # a grounded prompt carries the text its answer copies: long enough for a lookup to find
    for c, text in grounded.PROMPTS:
        if c != "chat":
            assert len(text) > 120, (c, text[:40])


def _rec(arm, digests, ok=True, warmup=False):
    return {"arm": arm, "ok": ok, "warmup": warmup, "output": {"digests": digests}}


def test_same_answers_compares_each_prompt_of_the_first_good_run():
    records = [_rec("off", ["a", "b", "c"], ok=False), _rec("off", ["a", "b", "c"]),
               _rec("ngram", ["a", "x", "c"]), _rec("ngram", ["a", "b", "c"])]
    out = grounded.same_answers(records, ("off", "ngram"))
    assert out["compared"] == 3 and out["identical"] == 2
    assert out["differ"] == [{"prompt": 1, "category": grounded.PROMPTS[1][0]}]
    assert grounded.same_answers([_rec("off", ["a"])], ("off", "ngram")) == {"compared": 0}


def test_the_grid_line_has_acceptance_only_where_proposals_were_made():
    base = {"grounded_tps": 50.0, "chat_tps": 40.0, "batch_tps": 60.0, "load_s": 9.0,
            "peak_rss_anon_mb": 800.0, "categories": {"quote": {"tps": 70.0}},
            "answers": [{"digest": "d1"}, {"digest": "d2"}]}
    line = grounded.metric_line({**base, "spec_decode": None})
    assert "accepted_share" not in line and line["quote_tps"] == 70.0 and line["digests"] == ["d1", "d2"]
    line = grounded.metric_line({**base, "spec_decode": {"draft_tokens": 40, "accepted_tokens": 10}})
    assert line["accepted_share"] == 0.25
    json.dumps(line, allow_nan=False)  # the grid reads it as strict JSON


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vllm_edge.cli", "bench", "grounded", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_bad_counts_are_refused_before_any_engine():
    proc = _cli("--passes", "0")
    assert proc.returncode == 2 and "--passes" in proc.stderr


def test_another_hosts_run_is_never_replaced(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    theirs = {"provenance": {"cpu": {"model": "Some Other CPU", "isa": {}}, "core_set": [0, 1]}}
    (out / "summary.json").write_text(json.dumps(theirs))
    proc = _cli("--out", str(out), "--passes", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Some Other CPU" in proc.stderr and "never replaces" in proc.stderr
    assert json.loads((out / "summary.json").read_text()) == theirs


def _summary(cpu: str, off: float, on: float, differ: list[dict]) -> dict:
    def arm(v):
        return {"n": 3, "median": v, "min": v * 0.99, "max": v * 1.01, "spread_pct": 2.0, "flags": []}
    return {"passes": 3, "busy_passes": [], "arms": [{"name": "off"}, {"name": "ngram"}],
            "metrics": {"grounded_tps": {"arms": {"off": arm(off), "ngram": arm(on)}}},
            "same_answers": {"ngram": {"compared": 16, "identical": 16 - len(differ), "differ": differ}},
            "provenance": {"cpu": {"model": cpu, "isa": {}}, "core_set": [0, 1]}}


def test_the_guide_table_has_one_table_per_host_with_the_ratio_and_the_answers(tmp_path):
    from vllm_edge.bench.report import guide_tables

    for slug, cpu, off, on, differ in (("a", "CPU A", 40.0, 60.0, [{"prompt": 4, "category": "rewrite"}]),
                                       ("b", "CPU B", 50.0, 45.0, [])):
        d = tmp_path / "results" / "grounded" / slug
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(_summary(cpu, off, on, differ)))
    doc = tmp_path / "docs" / "guide" / "run.md"
    text = guide_tables.render_grounded(tmp_path / "results", doc)
    a, b = text.split("CPU B")
    assert "CPU A" in a and "| 1.50x |" in a and "15 of 16 greedy answers identical" in a and "rewrite" in a
    assert "| 0.90x |" in b and "16 of 16" in b
    assert "../../results/grounded/a/summary.json" in a
    assert guide_tables.render_grounded(tmp_path / "empty", doc).startswith("_No `bench grounded` run")
