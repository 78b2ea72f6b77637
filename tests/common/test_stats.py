from __future__ import annotations

import pytest

from vllm_edge.common import stats


@pytest.mark.parametrize("name,expected", [
    ("tg128_tps", "higher"), ("decode_per_s", "higher"), ("top1_agreement", "higher"),
    ("exact_matches", "higher"), ("peak_tree_rss_anon_mb", "lower"), ("weights_bytes", "lower"),
    ("ready_s", "lower"), ("step_ms", "lower"), ("kl_mean", "lower"), ("mean_kld", "lower"),
    ("worker.ready_s", "lower"), ("pid", None), ("returncode", None), ("skill_level", None),
])
def test_direction_from_name(name, expected):
    assert stats.direction(name) == expected


def test_best_follows_direction():
    assert stats.summarize([3.0, 1.0, 2.0], "ready_s")["best"] == 1.0
    assert stats.summarize([10.0, 30.0, 20.0], "tg_tps")["best"] == 30.0
    assert stats.summarize([1.0, 2.0], "pid")["best"] is None


def test_median_spread_and_flags():
    s = stats.summarize([100.0, 104.0, 102.0], "ready_s")
    assert s["median"] == 102.0 and s["n"] == 3
    assert s["spread_pct"] == pytest.approx(4 / 102 * 100, abs=1e-3)
    assert s["flags"] == []
    noisy = stats.summarize([100.0, 150.0, 120.0], "ready_s")
    assert stats.NOISY in noisy["flags"]
    assert stats.NOISY not in stats.summarize([100.0, 150.0, 120.0], "ready_s", noisy_pct=50)["flags"]
    single = stats.summarize([5.0], "ready_s")
    assert single["flags"] == [stats.SINGLE_PASS]


def test_zero_median_spread():
    assert stats.summarize([0.0, 0.0], "kl_mean")["spread_pct"] == 0.0
    s = stats.summarize([-1.0, 0.0, 1.0], "kl_mean")
    assert s["spread_pct"] is None and stats.NOISY in s["flags"]


def test_not_a_ranking_when_ranges_overlap():
    a = stats.summarize([10.0, 12.0, 11.0], "tg_tps")
    b = stats.summarize([11.5, 13.0, 12.5], "tg_tps")
    r = stats.rank({"a": a, "b": b}, "tg_tps")
    assert r["order"] == ["b", "a"]
    assert r["flags"] == [stats.NOT_A_RANKING] and r["leader"] is None
    assert stats.NOT_A_RANKING in a["flags"] and stats.NOT_A_RANKING in b["flags"]


def test_clear_ranking_names_a_leader_lower_is_better():
    fast = stats.summarize([1.0, 1.1, 1.05], "ready_s")
    slow = stats.summarize([2.0, 2.1, 2.05], "ready_s")
    mid = stats.summarize([1.5, 1.6, 1.55], "ready_s")
    r = stats.rank({"slow": slow, "fast": fast, "mid": mid}, "ready_s")
    assert r["order"] == ["fast", "mid", "slow"]
    assert r["leader"] == "fast" and r["flags"] == []
    assert r["leader_vs_second"] == pytest.approx(1.05 / 1.55, rel=1e-3)


def test_single_pass_arms_cannot_rank():
    r = stats.rank({"a": stats.summarize([1.0], "ready_s"), "b": stats.summarize([9.0], "ready_s")},
                   "ready_s")
    assert stats.NOT_A_RANKING in r["flags"]


def test_undirected_metric_is_not_ranked():
    r = stats.rank({"a": stats.summarize([1.0, 1.0], "pid"), "b": stats.summarize([9.0, 9.0], "pid")}, "pid")
    assert r["order"] == [] and r["leader"] is None
