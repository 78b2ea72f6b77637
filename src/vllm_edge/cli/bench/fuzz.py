"""`vllm-edge bench fuzz`: seeded mutated request bodies against `serve`, 0 5xx expected."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out

NAME = "fuzz"
HELP = "seeded mutated request bodies against `serve` through its gate: counts by status"
DESCRIPTION = ("Starts `vllm-edge serve MODEL` with a random API key on a free loopback port, "
               "sends --count mutated bodies (chat, completions, embeddings, tokenize) built "
               "from --seed, stops the server. Exit 1 on any 5xx or dropped connection.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=512)
    add_out(p, default="benchmarks/results/security/fuzz.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import fuzz_serve

    result = fuzz_serve.run(args.model, seed=args.seed, count=args.count,
                            concurrency=args.concurrency, max_model_len=args.max_model_len,
                            out=args.out)
    print(json.dumps({k: result[k] for k in ("bodies", "wall_s", "by_status", "http_5xx",
                                             "health_after", "passed")}, indent=2))
    return 0 if result["passed"] else 1
