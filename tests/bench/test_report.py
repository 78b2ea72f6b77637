"""`vllm-edge report` from small synthetic artifacts: tables, PNGs, sources, hand-written text."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("matplotlib")

from vllm_edge.bench.render import splice  # noqa: E402
from vllm_edge.bench.report import results as report  # noqa: E402
from vllm_edge.common.stats import summarize  # noqa: E402


# A host and a committed tree: rows from it carry no audit flag.
CLEAN = {"cpu": {"model": "AMD EPYC", "isa": {"avx2": True}}, "core_set": [0, 1],
         "build": {"vllm_edge_git": "0" * 40}, "loadavg": [1.0, 1.0, 1.0]}


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
        splice(f"{report.END}\n{report.BEGIN}\n", "x\n", report.BEGIN, report.END)


def test_empty_results_dir(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    out = report.report(d, tmp_path / "results.md")
    assert out["plots"] == []
    assert "No speed artifacts yet" in (tmp_path / "results.md").read_text()


def test_grid_summaries_become_tables_with_flags_and_source(results, tmp_path):
    from vllm_edge.bench.grid import runner as grid

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


def test_a_grid_per_host_folder_gets_its_own_section_with_its_pairs(results, tmp_path):
    from vllm_edge.bench.grid import runner as grid

    recs = [{"arm": a, "ok": True, "pass": k, "metrics": {"peak_mb": m}}
            for k, (a, m) in enumerate([("off", 2600.0), ("on", 2180.0), ("off", 2610.0),
                                        ("on", 2185.0)])]
    summary = grid.summarize_runs(recs, ["off", "on"], ["peak_mb"], 10.0, [["off", "on"]])
    summary.update({"name": "tok", "passes": 2, "arms": [{"name": "off"}, {"name": "on"}]})
    for host in ("amd-epyc-avx512-bf16-2-cores", "intel-xeon-amx-bf16-2-cores"):
        gdir = results / "grid" / "tok" / host
        gdir.mkdir(parents=True)
        (gdir / "summary.json").write_text(json.dumps(summary))
    doc = tmp_path / "results.md"
    report.report(results, doc)
    text = doc.read_text()
    for host in ("amd-epyc-avx512-bf16-2-cores", "intel-xeon-amx-bf16-2-cores"):
        section = text[text.index(f"### `grid/tok/{host}`"):]
        assert f"Source: `{results}/grid/tok/{host}/summary.json`" in section
        assert "- on over off: `peak_mb` 0.838× (on ahead)" in section, section


# --- the default model's headline, bytes per token, bandwidth, fidelity per build ---------

def _speed_default(name, quant, tg, bytes_per_token, pct, stamp="2026-11-30T03:00:00"):
    art = _speed(f"{name} (bfloat16, compiled)", [300, 310, 305], tg)
    art["model"] = f"/home/u/.cache/vllm-edge/models/{name}"
    art["engine"] = {"engine_args": {}}
    art["bytes_per_token"] = {"quant_method": quant, "head_tied": quant is None,
                              "bits_per_weight": {"linears_and_head": 16.0 if quant is None else 4.5}}
    art["bandwidth"] = {"ceiling_gb_per_s": 20.0, "source": "benchmarks/results/bandwidth.json"}
    art["traffic"] = {"tg8_tps": {"context_tokens": 20, "weight_bytes": bytes_per_token - 460_800,
                                  "kv_bytes": 460_800, "bytes_per_token": bytes_per_token,
                                  "gb_per_s_effective": round(bytes_per_token * summarize(tg, "t_tps")["median"] / 1e9, 3),
                                  "pct_of_ceiling": pct}}
    art["provenance"] = {"timestamp": stamp, **CLEAN}
    return art


@pytest.fixture
def default_results(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    (d / "speed_bf16.json").write_text(json.dumps(
        _speed_default("smollm2-135m-bf16", None, [40, 44, 42], 269_491_968, 56.6)))
    (d / "speed_int4_g64.json").write_text(json.dumps(
        _speed_default("smollm2-135m-cpu_int4-g64", "cpu_int4", [80, 90, 85], 76_176_324, 32.4)))
    (d / "speed_int4_g128.json").write_text(json.dumps(
        _speed_default("smollm2-135m-cpu_int4-g128", "cpu_int4", [60, 62, 61], 73_000_000, 22.3)))
    fid = _fidelity("smollm2-135m-cpu_int4-g64 (bfloat16, compiled)", 0.0312)
    fid["model"] = "/home/u/.cache/vllm-edge/models/smollm2-135m-cpu_int4-g64"
    fid["greedy"].update(exact_matches=5, prompts=12, exact_matches_str="5/12")
    fid["provenance"] = CLEAN
    (d / "fidelity_default_cpu_int4.json").write_text(json.dumps(fid))
    (d / "bandwidth.json").write_text(json.dumps({
        "benchmark": "bandwidth", "build": "read bandwidth (2 threads)", "cores": [0, 1],
        "buffer_bytes": 512 << 20, "buffer_over_llc": 16.0, "ceiling_gb_per_s": 20.0,
        "metrics": {"read_gb_per_s": summarize([18.0, 20.0, 19.0], "read_gb_per_s")},
        "provenance": CLEAN}))
    return d


def test_headline_bf16_against_the_best_4bit_path(default_results, tmp_path):
    doc = tmp_path / "results.md"
    report.report(default_results, doc)
    text = doc.read_text()
    head = text.split("## Default model: bf16 against the best 4-bit path")[1].split("\n## ")[0]
    # the fastest 4-bit build (g64, tg median 85) is chosen over g128 (61)
    assert "best 4-bit: smollm2-135m-cpu_int4-g64 (bfloat16, compiled)" in head
    assert "g128" not in head.split("Source:")[0].split("|---|")[1]
    # medians with their spread, the ratio and the judgement (ranges 40–44 and 80–90 apart)
    assert "| tg8_tps | 42 (40–44, spread 9.5%, n=3) | 85 (80–90, spread 11.8%, n=3) | 2.02× | 4-bit ahead; NOISY (4-bit) |" in head
    assert "| pp64_tps |" in head and "NOT A RANKING" in head  # identical pp ranges overlap
    assert "| tg8_tps: MB/token | 269.5 | 76.2 | 0.28× | derived |" in head
    assert "| tg8_tps: % of ceiling | 56.6% | 32.4% |" in head
    # fidelity of that build, from its artifact
    assert "| fidelity vs bf16: greedy exact | reference | 5/12 |" in head
    assert "0.9700 / 0.0312 / 0.156" in head
    assert "fidelity_default_cpu_int4.json" in head.split("Source:")[1]
    # bytes per token per build and the bandwidth table
    assert "### Bytes per decoded token" in text and "| 269.5 |" in text
    assert "| read bandwidth (2 threads) | 0,1 | 512 MiB | 16 | 20 | 19 |" in text
    png = default_results / report.PLOT_NAMES["fidelity"]
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_headline_says_what_is_missing(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    (d / "speed_bf16.json").write_text(json.dumps(
        _speed_default("smollm2-135m-bf16", None, [40, 44, 42], 269_491_968, 56.6)))
    doc = tmp_path / "results.md"
    report.report(d, doc)
    text = doc.read_text()
    assert "No 4-bit `bench speed` artifact of the default model yet" in text
    assert "No bandwidth artifacts yet" in text


def test_a_ceiling_no_bandwidth_artifact_of_the_host_holds_is_not_a_share(default_results, tmp_path):
    """A speed run that took its ceiling from another machine (before ceilings were kept per
    host) shows its bytes and GB/s, but no share of a ceiling this host never measured."""
    (default_results / "bandwidth.json").unlink()
    doc = tmp_path / "results.md"
    report.report(default_results, doc)
    text = doc.read_text()
    head = text.split("## Default model: bf16 against the best 4-bit path")[1].split("\n## ")[0]
    assert "| tg8_tps: % of ceiling | – | – |" in head
    traffic = text.split("### Bytes per decoded token")[1].split("\n## ")[0]
    assert "another host's ceiling" in traffic and "56.6%" not in traffic


def test_per_host_bandwidth_files_are_read(default_results, tmp_path):
    """A bandwidth result kept in bandwidth/<host>.json is this host's ceiling as a top-level
    file was: the share of it is shown, and the file named."""
    (default_results / "bandwidth").mkdir()
    (default_results / "bandwidth.json").rename(default_results / "bandwidth" / "amd-epyc-avx2-2-cores.json")
    doc = tmp_path / "results.md"
    report.report(default_results, doc)
    text = doc.read_text()
    assert "bandwidth/amd-epyc-avx2-2-cores.json" in text.split("## Read bandwidth")[1]
    assert "56.6%" in text.split("### Bytes per decoded token")[1]
