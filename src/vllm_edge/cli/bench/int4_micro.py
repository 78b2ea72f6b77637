"""`vllm-edge bench int4-micro`: the cpu_int4 op against a bf16 linear, interleaved."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_out, add_threads
from vllm_edge.quant.groups import DEFAULT_GROUP, KERNEL_GROUPS

NAME = "int4-micro"
HELP = "microbenchmark: the cpu_int4 op (and its routes) against bf16 linears, per shape and rows"
DESCRIPTION = "Batch-1 (and batch-M) timing of the cpu_int4 op against a bf16 linear, interleaved."
SETS = ("lm", "vision")  # bench.micro.int4.SETS (tests/cli check they match)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--passes", type=int, default=7)
    add_threads(p, default=2, help="torch threads (default %(default)s)")
    p.add_argument("--set", choices=SETS, default="lm",
                   help="lm: SmolLM2, 4096 and 1B shapes at 1-512 rows; vision: the VLM's vision "
                        "tower at 1024 rows (one image tile)")
    p.add_argument("--rows", default=None, help="activation rows, comma-separated (default: the set's)")
    p.add_argument("--group", type=int, choices=KERNEL_GROUPS, default=DEFAULT_GROUP)
    p.add_argument("--shapes", default=None, help="substrings of shape labels to run (default: all)")
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler breakdown of the multi-row route at the largest row count")
    add_out(p, help="default: benchmarks/results/cpu_int4_microbench.json (lm) or "
                    "cpu_int4_microbench_vision.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench.micro import int4

    int4.main(args.set, rows=tuple(int(r) for r in args.rows.split(",")) if args.rows else None,
              passes=args.passes, group=args.group, threads=args.threads,
              shapes=args.shapes.split(",") if args.shapes else None, profile=args.profile,
              out=args.out)
    return 0
