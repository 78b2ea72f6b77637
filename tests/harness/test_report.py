"""`vllm-edge report` from small synthetic artifacts: tables, PNGs, sources, hand-written text."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("matplotlib")

from vllm_edge.harness import report  # noqa: E402
from vllm_edge.harness.stats import summarize  # noqa: E402


def _speed(build, pp, tg):
    return {"benchmark": "speed", "build": build, "load_s": 12.5,
            "metrics": {"pp64_tps": summarize(pp, "pp64_tps"), "tg8_tps": summarize(tg, "tg8_tps")},
            "memory_phases": {"load_peak_rss_anon_mb": 900.0, "bench_peak_rss_anon_mb": 950.0},
            "pinning": {"threads": 2}}


def _fidelity(build, kl):
    return {"benchmark": "fidelity", "build": build, "reference_build": "bf16",
            "greedy": {"exact_matches_str": "11/12", "kept_fraction": 0.95, "first_token_agreement": 1.0},
            "teacher_forced": {"top1_agreement": 0.97, "kl_mean": kl, "kl_median": kl / 2,
                               "kl_p99": kl * 5, "delta_logprob": -0.01, "coverage": 0.99},
            "kl_k": 10}


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "benchmarks" / "results"
    d.mkdir(parents=True)
    (d / "speed_bf16.json").write_text(json.dumps(_speed("bf16", [100, 110, 105], [20, 22, 21])))
    (d / "fid.jsonl").write_text(json.dumps(_fidelity("int4", 0.02)) + "\n"
                                 + json.dumps(_fidelity("int8", 0.004)) + "\n")
    (d / "aot_cache.json").write_text(json.dumps({"benchmark": "aot-cache",
                                                   "summary": {"cold_init_engine_s": 40.0}}))
    (d / "broken.json").write_text("{not json")
    return d


def test_report_writes_tables_plots_and_sources(results, tmp_path):
    doc = tmp_path / "docs" / "results.md"
    out = report.report(results, doc)
    text = doc.read_text()
    for name in report.PLOT_NAMES.values():
        png = results / name
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(out["plots"]) == 3
    assert "| bf16 | pp64_tps | 110 | 105 | 100 | 110 | 9.5% |" in text
    assert "| int4 | bf16 | 11/12 |" in text and "cold_init_engine_s" in text
    assert "skipped" in text and "broken.json" in text
    # every figure and every table is followed by a Source line naming artifact files
    lines = text.splitlines()
    images = [i for i, l in enumerate(lines) if l.startswith("![")]
    assert len(images) == 3
    for i in images:
        src = next(l for l in lines[i + 1:] if l.strip())
        assert src.startswith("Source: `") and str(results) in src
    tables = [i for i, l in enumerate(lines) if l.startswith("|") and not lines[i + 1].startswith("|")]
    for i in tables:
        src = next(l for l in lines[i + 1:] if l.strip())
        assert src.startswith(("Source: `", "RssAnon")), lines[i]
    assert "fid.jsonl" in text and "speed_bf16.json" in text
    # image links resolve relative to the doc
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (doc.parent / link).resolve().exists()


def test_hand_written_text_survives(results, tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Mine\n\nKeep this intro.\n\n" + report.BEGIN + "\nold stuff\n" + report.END
                   + "\n\n## Notes\nKeep this too.\n")
    report.report(results, doc)
    text = doc.read_text()
    assert text.startswith("# Mine\n\nKeep this intro.\n\n" + report.BEGIN)
    assert text.endswith(report.END + "\n\n## Notes\nKeep this too.\n")
    assert "old stuff" not in text and "## Speed" in text
    once = text
    report.report(results, doc)
    assert doc.read_text() == once  # regeneration is stable


def test_markers_appended_or_created(results, tmp_path):
    doc = tmp_path / "plain.md"
    doc.write_text("# Only prose\n")
    report.report(results, doc)
    text = doc.read_text()
    assert text.startswith("# Only prose\n") and report.BEGIN in text and report.END in text
    fresh = tmp_path / "new" / "results.md"
    report.report(results, fresh)
    assert report.BEGIN in fresh.read_text()


def test_unbalanced_markers_are_refused():
    with pytest.raises(ValueError, match="unbalanced"):
        report.splice(f"{report.END}\n{report.BEGIN}\n", "x\n")


def test_empty_results_dir(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    out = report.report(d, tmp_path / "results.md")
    assert out["plots"] == []
    assert "No speed artifacts yet" in (tmp_path / "results.md").read_text()


def test_grid_summaries_become_tables_with_flags_and_source(results, tmp_path):
    from vllm_edge.harness import grid

    recs = [{"arm": a, "ok": True, "pass": k, "metrics": {"ready_s": v, "peak_mb": m}}
            for k, (a, v, m) in enumerate([("stock", 90.0, 3000.0), ("edge", 17.0, 1100.0),
                                           ("stock", 94.0, 3040.0), ("edge", 16.0, 1120.0)])]
    summary = grid.summarize_runs(recs, ["stock", "edge"], ["ready_s", "peak_mb"], 10.0)
    summary.update({"name": "levers", "description": "one lever per arm", "passes": 2,
                    "arms": [{"name": "stock"}, {"name": "edge"}], "busy_passes": [1], "warmup": True})
    gdir = results / "grid" / "levers"
    gdir.mkdir(parents=True)
    (gdir / "summary.json").write_text(json.dumps(summary))
    doc = tmp_path / "results.md"
    report.report(results, doc)
    text = doc.read_text()
    section = text[text.index("### `grid/levers`"):]
    assert "one lever per arm" in section
    assert re.search(r"\| stock \| 92 ±2% \| 3020 ±1% \|", section), section
    assert re.search(r"\| edge \| 16\.5 ±3% \| 1110 ±1% \|", section), section
    assert "busy passes [1]" in section and "warm-up" in section
    assert "leader: edge" in section
    assert f"Source: `{results}/grid/levers/summary.json`" in section
