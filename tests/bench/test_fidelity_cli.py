"""`vllm-edge fidelity` wiring without an engine: flags, lengths, the metric line."""

from __future__ import annotations

import pytest

from vllm_edge.bench.fidelity import run as fidelity_cli
from vllm_edge.cli import build_parser


def test_needs_exactly_one_mode():
    p = build_parser()
    with pytest.raises(SystemExit):
        p.parse_args(["fidelity"])
    with pytest.raises(SystemExit):
        p.parse_args(["fidelity", "--save-ref", "a", "--ref", "b"])
    args = p.parse_args(["fidelity", "--ref", "r", "--corpus-chunks", "2"])
    assert args.ref == "r" and args.corpus_chunks == 2 and args.kl_k == 10


def test_needed_len_rounds_up():
    assert fidelity_cli.needed_len([[0] * 1900, [0] * 10], [[0] * 512], 64) == 2048
    assert fidelity_cli.needed_len([[0] * 10], [[0] * 512], 64) == 768


def test_metric_line():
    res = {"build": "b", "greedy": {"exact_matches": 12, "kept_fraction": 1.0, "first_token_agreement": 1.0},
           "teacher_forced": {"top1_agreement": 1.0, "kl_mean": 0.0, "kl_median": 0.0, "kl_p99": 0.0,
                              "delta_logprob": 0.0, "coverage": 1.0, "positions": 10}}
    line = fidelity_cli.metric_line(res)
    assert line["kl_mean"] == 0.0 and line["exact_matches"] == 12 and "positions" not in line
