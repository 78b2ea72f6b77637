"""A ratio's noise flags come from the pair itself: two arms whose ranges overlap read NOT A
RANKING even when neither carried the flag in its grid (only a grid's top two do), a pair
outside each other's range does not inherit it, and fewer than three passes are named."""

from __future__ import annotations

import json

from vllm_edge.bench.report import claims
from vllm_edge.common import stats


def _arm(median, lo, hi, n=3, flags=()):
    return {"n": n, "median": median, "min": lo, "max": hi, "best": hi, "spread_pct": 1.0,
            "flags": list(flags)}


def _figure(tmp_path, a, b):
    grid = {"arms": [{"name": "a", "cmd": []}, {"name": "b", "cmd": []}],
            "metrics": {"tg128_tps": {"arms": {"a": a, "b": b}}}, "provenance": {}}
    (tmp_path / "g.json").write_text(json.dumps(grid))
    claim = claims.Claim("s", "a / b", "g.json", claims._arm("tg128_tps", "a"), "{:.2f}×",
                         per=(None, claims._arm("tg128_tps", "b")))
    return claims.evaluate(claim, tmp_path)


def test_overlapping_arms_are_not_a_ranking_whatever_their_grid_said(tmp_path):
    f = _figure(tmp_path, _arm(10, 9, 11), _arm(9.5, 9, 10))  # neither flagged in its grid
    assert stats.NOT_A_RANKING in f.flags


def test_a_pair_outside_the_noise_drops_a_flag_it_did_not_earn(tmp_path):
    f = _figure(tmp_path, _arm(20, 19, 21, flags=[stats.NOT_A_RANKING]), _arm(10, 9, 11))
    assert stats.NOT_A_RANKING not in f.flags and f.text == "2.00×"


def test_two_passes_are_named(tmp_path):
    f = _figure(tmp_path, _arm(20, 19, 21, n=2), _arm(10, 9, 11, n=2))
    assert "n=2" in f.flags and stats.NOT_A_RANKING not in f.flags
    one = _figure(tmp_path, _arm(20, 20, 20, n=1), _arm(10, 10, 10, n=1))
    assert stats.NOT_A_RANKING in one.flags and "n=1" in one.flags
