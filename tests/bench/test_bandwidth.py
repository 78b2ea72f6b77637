"""`vllm-edge bandwidth`: the result's shape on a tiny buffer (no speed asserted), the LLC
guard, and how `bench speed` reads a ceiling back and turns it into % of ceiling."""

from __future__ import annotations

import json
import os

import pytest

from support.cli_runner import run_cli
from vllm_edge.bench import bandwidth as bw
from vllm_edge.bench import speed
from vllm_edge.common.stats import summarize


def test_json_shape_on_a_tiny_buffer(tmp_path):
    out = tmp_path / "bw.json"
    proc = run_cli("bandwidth", "--threads", "1", "--buffer-mib", "2", "--reps", "2",
                   "--allow-in-cache", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "bandwidth" and line["out"] == str(out)
    res = json.loads(out.read_text())
    assert res["benchmark"] == "bandwidth" and res["threads"] == 1
    assert len(res["cores"]) == 1 and res["cores"][0] in os.sched_getaffinity(0)
    assert res["buffer_bytes"] == 2 << 20
    assert set(res["runs"]) == {"sum_f64", "amax_f32"}
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in res["runs"].values())
    m = res["metrics"][bw.METRIC]
    assert m["n"] == 4 and m["direction"] == "higher"
    assert m["best"] == max(x for v in res["runs"].values() for x in v)
    for key in ("sum_f64_gb_per_s", "amax_f32_gb_per_s"):
        assert res["metrics"][key]["n"] == 2
    llc = res["llc_bytes"]
    if llc and llc * bw.MIN_LLC_MULTIPLE > 2 << 20:
        # a 2 MiB buffer fits the cache: marked, and never a ceiling
        assert res["in_cache"] is True and res["ceiling_gb_per_s"] is None
        assert line["ceiling_gb_per_s"] is None
    prov = res["provenance"]
    assert prov["threads"] == 1 and prov["core_set_pinned"] == res["cores"]
    assert prov["env"]["OMP_NUM_THREADS"] == "1"


def test_a_buffer_in_the_cache_is_refused_without_the_flag(tmp_path):
    llc = bw.llc_bytes({"L1d": 32, "L2": 1024, "L3": 32768})
    assert llc == 32 << 20
    with pytest.raises(bw.BandwidthError, match="under 8x the last-level cache"):
        bw.check_buffer(64 << 20, llc, allow_in_cache=False)
    assert bw.check_buffer(64 << 20, llc, allow_in_cache=True) is False
    assert bw.check_buffer(256 << 20, llc, allow_in_cache=False) is True
    assert bw.default_buffer_bytes(llc) == 512 << 20
    assert bw.default_buffer_bytes(256 << 20) == 4096 << 20
    assert bw.default_buffer_bytes(None) == 512 << 20
    # through the CLI: refused before any buffer is allocated, exit 2, the LLC named
    from vllm_edge.common.hw import probe_cpu

    real = bw.llc_bytes(probe_cpu().cache_kib)
    if real is None or real * bw.MIN_LLC_MULTIPLE <= 1 << 20:
        pytest.skip("this machine reports no LLC larger than 128 KiB")
    proc = run_cli("bandwidth", "--buffer-mib", "1", "--reps", "1", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and "last-level cache" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def _artifact(tmp_path, cores, in_cache=False, ceiling=20.0, name="bw.json", cpu=None):
    """A bandwidth result measured on ``cores`` of this machine (or of the ``cpu`` given)."""
    from vllm_edge.common import provenance

    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"benchmark": "bandwidth", "cores": cores, "threads": len(cores),
                             "in_cache": in_cache, "ceiling_gb_per_s": None if in_cache else ceiling,
                             "median_gb_per_s": ceiling * 0.9, "buffer_bytes": 1 << 29,
                             "provenance": {"timestamp": "t", "loadavg": [0.1, 0.1, 0.1],
                                            "cpu": cpu or provenance.collect()["cpu"],
                                            "core_set": cores}}))
    return p


def test_another_hosts_ceiling_is_refused(tmp_path):
    other = {"model": "Some Other CPU 9999", "arch": "x86_64", "isa": {"avx2": True}}
    p = _artifact(tmp_path, [0, 1], cpu=other)
    with pytest.raises(bw.BandwidthError, match="measured on Some Other CPU 9999, AVX2, 2 cores, this run is on"):
        bw.load_ceiling(p, [0, 1])
    # the default file is this host's own
    assert bw.default_out([0, 1]).startswith(bw.DEFAULT_DIR + "/")
    assert bw.default_out([0, 1]) != bw.default_out([0])


def test_load_ceiling_checks_the_cores_and_the_cache(tmp_path):
    good = _artifact(tmp_path, [0, 1])
    got = bw.load_ceiling(good, [1, 0])
    assert got["ceiling_gb_per_s"] == 20.0 and got["source"] == str(good)
    with pytest.raises(bw.BandwidthError, match=r"measured on cores \[0, 1\], this run uses \[0\]"):
        bw.load_ceiling(good, [0])
    with pytest.raises(bw.BandwidthError, match="fit in the cache"):
        bw.load_ceiling(_artifact(tmp_path, [0], in_cache=True, name="c.json"), [0])
    (tmp_path / "speed.json").write_text(json.dumps({"benchmark": "speed"}))
    with pytest.raises(bw.BandwidthError, match="speed.json: not a `vllm-edge bandwidth` result"):
        bw.load_ceiling(tmp_path / "speed.json", [0])
    with pytest.raises(bw.BandwidthError, match="no bandwidth result"):
        bw.load_ceiling(tmp_path / "missing.json", [0])


def test_speed_resolves_the_ceiling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert speed.resolve_ceiling("off", [0])["ceiling_gb_per_s"] is None
    # auto with nothing measured: no ceiling, and the reason says why (the run goes on)
    auto = speed.resolve_ceiling("auto", [0, 1])
    assert auto["ceiling_gb_per_s"] is None and "no bandwidth result" in auto["reason"]
    _artifact(tmp_path, [0, 1], name=bw.default_out([0, 1]))
    assert speed.resolve_ceiling("auto", [0, 1])["ceiling_gb_per_s"] == 20.0
    # one core is another host label (its core count), so its own file, not measured yet
    assert "no bandwidth result" in speed.resolve_ceiling("auto", [0])["reason"]
    # an explicit file that does not fit is an error before any engine starts
    with pytest.raises(speed.SpeedArgError, match="--bandwidth .*this run uses"):
        speed.resolve_ceiling(str(_artifact(tmp_path, [3])), [0, 1])


def test_traffic_fields_on_a_speed_result():
    from vllm_edge.bench import bytes_per_token as bpt

    from .test_bytes_per_token import BF16_TOTAL, KV_PER_TOKEN, SMOL, bf16_specs

    acc = bpt.account(SMOL, bf16_specs())
    cfg = speed.SpeedConfig(tg_tokens=128, context_lens=(1024,))
    contexts = speed.tg_contexts(cfg)
    assert contexts == [("tg128_tps", 16 + 64), ("tg128_at_d1024_tps", 1024 + 64)]
    result = {"build": "b", "load_s": 1.0, "memory_phases": {"x_mb": 1.0},
              "metrics": {"pp512_tps": summarize([500.0], "pp512_tps"),
                          "tg128_tps": summarize([40.0, 50.0, 45.0], "tg128_tps"),
                          "tg128_at_d1024_tps": summarize([30.0], "tg128_at_d1024_tps")}}
    ceiling = {"ceiling_gb_per_s": 24.0, "source": "bw.json", "threads": 2, "cores": [0, 1]}
    t = speed.traffic(result, acc, contexts, ceiling)
    assert set(t) == {"tg128_tps", "tg128_at_d1024_tps"}  # pp and batch runs are not batch-1 decode
    b0 = BF16_TOTAL + 80 * KV_PER_TOKEN
    assert t["tg128_tps"]["bytes_per_token"] == b0
    assert t["tg128_tps"]["gb_per_s_effective"] == pytest.approx(b0 * 45.0 / 1e9, abs=1e-3)
    assert t["tg128_tps"]["pct_of_ceiling"] == pytest.approx(100 * b0 * 45.0 / 1e9 / 24.0, abs=0.05)
    assert t["tg128_tps"]["gb_per_s_effective_best"] == pytest.approx(b0 * 50.0 / 1e9, abs=1e-3)
    assert t["tg128_at_d1024_tps"]["kv_bytes"] == 1088 * KV_PER_TOKEN
    result["traffic"] = t
    result["bandwidth"] = ceiling
    line = speed.metric_line(result)
    assert line["bytes_per_token"] == b0 and line["pct_of_ceiling"] == t["tg128_tps"]["pct_of_ceiling"]
    assert line["tg128_at_d1024_bytes_per_token"] == BF16_TOTAL + 1088 * KV_PER_TOKEN
    table = speed.format_table(result)
    assert "tg128_tps: 270.9 MB/token" in table and "% of 24.0 GB/s" in table
    # no ceiling: the bytes are still reported, the share is None and the reason is shown
    t2 = speed.traffic(result, acc, contexts, {"ceiling_gb_per_s": None, "reason": "--bandwidth off"})
    assert t2["tg128_tps"]["pct_of_ceiling"] is None and t2["tg128_tps"]["bytes_per_token"] == b0
    result.update(traffic=t2, bandwidth={"ceiling_gb_per_s": None, "reason": "--bandwidth off"})
    assert "no bandwidth ceiling: --bandwidth off" in speed.format_table(result)
