"""`vllm-edge bench rmsnorm`: rms_norm and fused_add_rms_norm, edge_cpu provider vs native."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_model, add_out, add_threads

NAME = "rmsnorm"
HELP = "rms_norm and fused_add_rms_norm: edge_cpu provider vs native"
DESCRIPTION = "`vllm-edge bench rmsnorm`: both norm ops in isolation, provider against native."


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p, help="model whose hidden size and epsilon to use")
    p.add_argument("--passes", type=int, default=15, help="rotated passes over the arms (default 15)")
    add_threads(p, help="torch threads (default: allowed cores)")
    add_out(p, default="benchmarks/results/rmsnorm_micro.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench.micro import rmsnorm

    return rmsnorm.main(args.model, args.passes, args.threads, args.out)
