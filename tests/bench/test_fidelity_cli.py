"""`vllm-edge fidelity` wiring without an engine: lengths, the metric line (flags: tests/cli)."""

from __future__ import annotations

from vllm_edge.bench.fidelity import run as fidelity_cli


def test_needed_len_rounds_up():
    assert fidelity_cli.needed_len([[0] * 1900, [0] * 10], [[0] * 512], 64) == 2048
    assert fidelity_cli.needed_len([[0] * 10], [[0] * 512], 64) == 768


def test_metric_line():
    res = {"build": "b", "greedy": {"exact_matches": 12, "kept_fraction": 1.0, "first_token_agreement": 1.0},
           "teacher_forced": {"top1_agreement": 1.0, "kl_mean": 0.0, "kl_median": 0.0, "kl_p99": 0.0,
                              "delta_logprob": 0.0, "coverage": 1.0, "positions": 10}}
    line = fidelity_cli.metric_line(res)
    assert line["kl_mean"] == 0.0 and line["exact_matches"] == 12 and "positions" not in line
