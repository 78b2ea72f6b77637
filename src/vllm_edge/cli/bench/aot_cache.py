"""`vllm-edge bench aot-cache`: cold vs warm starts on one VLLM_CACHE_ROOT."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_model, add_out

NAME = "aot-cache"
HELP = "cold vs warm starts on one VLLM_CACHE_ROOT"


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--starts", type=int, default=3, help="1 cold start, then warm starts")
    p.add_argument("--cache-root", default=None, help="compile cache root (default: a fresh temp dir)")
    p.add_argument("--one-process", action="store_true",
                   help="run the starts in the edge one-process mode (default: vLLM's processes)")
    p.add_argument("--no-unpatched", action="store_true",
                   help="skip the final start with the patch disabled (stock vLLM behaviour)")
    add_out(p, default="benchmarks/results/aot_cache.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import aot_cache as aot_bench

    result = aot_bench.run(model=args.model, starts=args.starts, out=args.out,
                           cache_root=args.cache_root, unpatched=not args.no_unpatched,
                           multiprocess=not args.one_process)
    print(json.dumps(result["summary"], indent=2))
    return 0 if result["summary"]["direct_load_on_warm_starts"] else 1
