"""Every published number names its host and survives an audit: each check below is fed a
deliberately broken artifact and must catch it (a table mixing hosts, a ratio across hosts, a
dirty or unknown commit, too few passes, a busy host)."""

from __future__ import annotations

import json

import pytest

from vllm_edge.bench import render
from vllm_edge.bench.report import claims
from vllm_edge.bench.report import results as report
from vllm_edge.common import provenance, stats

AMD = {"cpu": {"model": "AMD EPYC", "isa": {"avx2": True, "avx512": True, "avx512_bf16": True}},
       "core_set": [0, 1], "build": {"vllm_edge_git": "a" * 40}, "loadavg": [1.0, 1.0, 1.0],
       "timestamp": "2026-11-30T10:00:00+0000"}
XEON = {**AMD, "cpu": {"model": "Intel(R) Xeon(R) Processor", "isa": {"amx_bf16": True}}}


def _speed(prov: dict, tg: list[float]) -> dict:
    return {"benchmark": "speed", "build": "b", "metrics": {"tg8_tps": stats.summarize(tg, "tg8_tps")},
            "provenance": prov}


def test_the_host_names_cpu_isa_and_cores():
    assert provenance.host(AMD) == "AMD EPYC, AVX512-BF16, 2 cores"
    assert provenance.host(XEON) == "Intel Xeon Processor, AMX-BF16, 2 cores"


# --- host mixing -------------------------------------------------------------------------

def test_a_table_refuses_a_row_from_another_host():
    with pytest.raises(render.MixedHosts, match="AMD EPYC.*Intel Xeon"):
        render.host_table(provenance.host(AMD), ["build"], [["x"], ["y"]],
                          [provenance.host(AMD), provenance.host(XEON)])


def test_a_ratio_across_two_hosts_is_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_speed(AMD, [20, 21, 22])))
    (tmp_path / "b.json").write_text(json.dumps(_speed(XEON, [10, 11, 12])))  # the broken one
    claim = claims.Claim("s", "a / b", "a.json", ("metrics", "tg8_tps"), "{:.2f}×",
                         per=("b.json", ("metrics", "tg8_tps")))
    with pytest.raises(render.MixedHosts):
        claims.evaluate(claim, tmp_path)


def test_two_hosts_get_two_tables_each_named(tmp_path):
    (tmp_path / "speed_amd.json").write_text(json.dumps(_speed(AMD, [20, 21, 22])))
    (tmp_path / "speed_xeon.json").write_text(json.dumps(_speed(XEON, [10, 11, 12])))
    report.report(tmp_path, tmp_path / "results.md")
    speed = (tmp_path / "results.md").read_text().split("## Speed")[1].split("\n## ")[0]
    blocks = speed.split("Host: **")[1:]
    hosts = [b.split("**")[0] for b in blocks]
    assert provenance.host(AMD) in hosts and provenance.host(XEON) in hosts
    for b in blocks:  # every table under a host line holds only that host's artifact
        table = b.split("\n\n")[1]
        if table.startswith("| build | metric"):
            assert ("speed_amd" in table) != ("speed_xeon" in table), table
    assert (tmp_path / "report_speed_host2.png").exists()


def test_the_measured_page_gives_each_host_its_own_table(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text(json.dumps(_speed(AMD, [20, 21, 22])))
    (tmp_path / "b.json").write_text(json.dumps(_speed(XEON, [10, 11, 12])))
    monkeypatch.setattr(claims, "CLAIMS", (
        claims.Claim("S", "amd", "a.json", ("metrics", "tg8_tps"), "{:.1f}"),
        claims.Claim("S", "xeon", "b.json", ("metrics", "tg8_tps"), "{:.1f}")))
    page = claims.render_page(tmp_path, tmp_path / "docs/results/measured.md")
    section = page.split("## S")[1]
    assert section.count("Host: **") == 2 and section.count("| figure |") == 2


# --- flags ----------------------------------------------------------------------------------

@pytest.mark.parametrize("broken,flag", [
    ({"build": {"vllm_edge_git": "a" * 40 + "-dirty"}}, provenance.DIRTY_TREE),
    ({"build": {}}, provenance.UNKNOWN_COMMIT),
    ({"loadavg": [7.5, 7.0, 6.0]}, "busy host (load avg 7.5 on 2 cores)"),
])
def test_a_broken_artifact_is_flagged_on_every_page(tmp_path, monkeypatch, broken, flag):
    (tmp_path / "speed_x.json").write_text(json.dumps(_speed({**AMD, **broken}, [20, 21, 22])))
    claim = claims.Claim("S", "tg", "speed_x.json", ("metrics", "tg8_tps"), "{:.1f}")
    assert flag in claims.evaluate(claim, tmp_path).flags
    monkeypatch.setattr(claims, "CLAIMS", (claim,))
    assert flag in claims.render_page(tmp_path, tmp_path / "m.md")
    report.report(tmp_path, tmp_path / "results.md")
    rows = [ln for ln in (tmp_path / "results.md").read_text().splitlines()
            if ln.startswith("| b |") and "speed_x.json`" in ln]
    assert rows and all(flag in ln for ln in rows)


def test_a_clean_artifact_carries_no_audit_flag(tmp_path):
    (tmp_path / "speed_x.json").write_text(json.dumps(_speed(AMD, [20, 21, 22])))
    fig = claims.evaluate(claims.Claim("S", "tg", "speed_x.json", ("metrics", "tg8_tps"), "{:.1f}"), tmp_path)
    assert fig.flags == []


def test_fewer_than_three_passes_are_flagged(tmp_path):
    (tmp_path / "speed_x.json").write_text(json.dumps(_speed(AMD, [20, 21])))
    fig = claims.evaluate(claims.Claim("S", "tg", "speed_x.json", ("metrics", "tg8_tps"), "{:.1f}"), tmp_path)
    assert "n=2" in fig.flags


def test_the_audit_trail_names_host_date_commit_and_command(tmp_path):
    (tmp_path / "speed_x.json").write_text(json.dumps(_speed({**AMD, "command": "vllm-edge bench speed "
                                                              "--model /home/u/m --out x.json"}, [1, 2, 3])))
    (tmp_path / "grid").mkdir()
    text = report.render_audit(tmp_path, tmp_path / "docs/results/README.md", tmp_path)
    row = next(ln for ln in text.splitlines() if ln.startswith("| `speed` |"))
    assert provenance.host(AMD) in row and "2026-11-30" in row and "clean" in row
    assert "`vllm-edge bench speed --model m --out x.json`" in row  # no machine path


def test_the_command_is_recorded_without_a_machine_path():
    assert provenance.command(["/opt/venv/bin/vllm-edge", "bench", "speed"]) == "vllm-edge bench speed"
    assert provenance.command(["/x/src/vllm_edge/cli/__main__.py", "report"]) == "vllm-edge report"
