"""`vllm-edge bench ledger`: attribute the weight process's RssAnon to tensors and KV."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_model, add_out

NAME = "ledger"
HELP = "attribute the weight process's RssAnon to tensors and KV"


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--multiprocess", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    add_out(p, default="benchmarks/results/ledger.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import ledger

    result = ledger.bench(model=args.model, context_len=args.context_len,
                          max_model_len=args.max_model_len, multiprocess=args.multiprocess,
                          enforce_eager=args.enforce_eager, out=args.out)
    for led in result["ledgers"]:
        print(json.dumps({k: led[k] for k in ("pid", "rss_anon_mb", "roles", "tied_mb", "kv_cache",
                                              "opaque_packed_handles", "attributed_mb",
                                              "unattributed_mb")}, indent=2))
    return 0
