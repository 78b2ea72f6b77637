"""bench scale-prefetch: every distance timed in every round against no prefetch, on each
activation route the CPU has; arguments it cannot measure are refused before anything runs."""

from __future__ import annotations

import pytest

from vllm_edge.bench.micro import scale_stream as ss
from vllm_edge.quant import native


def test_refuses_what_it_cannot_compare():
    with pytest.raises(ss.ScaleStreamError, match="must include 0"):
        ss.run(ahead=(2, 4))
    with pytest.raises(ss.ScaleStreamError, match="unknown shape set"):
        ss.run(sets=("gpt-5",))
    with pytest.raises(ss.ScaleStreamError, match="at least 3"):
        ss.run(rounds=2)


def test_every_distance_is_paired_with_no_prefetch_in_every_round():
    if native.library() is None or not native.gemv_supported():
        pytest.skip("no AVX512-BF16 int4 product on this CPU")
    lines = []
    out = ss.run(sets=("smollm2-135m",), ahead=(0, 4), rounds=3, threads=1, layers=2, log=lines.append)
    routes = [r["activations"] for r in out["results"]]
    assert routes[0] == "bf16" and set(routes) <= {"bf16", "int8"} and len(lines) == len(routes)
    for r in out["results"]:
        assert r["layers"] == 2 * len(ss.SETS["smollm2-135m"][0])
        assert r["bytes"] == sum(n * k // 2 + (k // ss.GROUP) * n * 2 * 2
                                 for n, k in ss.SETS["smollm2-135m"][0]) * 2
        assert set(r["gb_per_s"]) == {"0", "4"} and all(s["n"] == 3 for s in r["gb_per_s"].values())
        sp = r["speedup_vs_0"]["4"]
        assert sp["rounds"] == 3 and 0 <= sp["rounds_faster"] <= 3 and sp["q1"] <= sp["median"] <= sp["q3"]
