"""`vllm-edge bench plugin-import`: what the plugin adds to vLLM's import and plugin load."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out

NAME = "plugin-import"
HELP = "what the plugin adds to vLLM's import and plugin load"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reps", type=int, default=5)
    add_out(p, default="benchmarks/results/plugin_import.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import plugin_import as import_cost

    result = import_cost.run(reps=args.reps, out=args.out)
    print(json.dumps(result["summary"], indent=2))
    return 0
