"""`vllm-edge bench soak`: concurrent mixed clients against `serve`."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out

NAME = "soak"
HELP = "concurrent mixed clients against `serve`: errors by class, TTFT/TPOT, RssAnon"
DESCRIPTION = ("Starts `vllm-edge serve MODEL` on a free loopback port (or uses --base-url "
               "with --server-pid), runs --clients concurrent clients for --duration seconds "
               "or --max-requests requests, whichever ends first, then stops the server. "
               "Exit 1 on any 5xx, unexpected outcome, or RssAnon not flat within 5%% after "
               "warm-up.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--duration", type=float, default=600, help="seconds (default 600)")
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds excluded from the RssAnon flatness check (default: 20%% of --duration)")
    p.add_argument("--enforce-eager", action="store_true", help="start the server without torch.compile")
    p.add_argument("--base-url", default=None, help="a running server (loopback only)")
    p.add_argument("--server-pid", type=int, default=None, help="its pid, root of the RssAnon tree")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="soak the same server this many times in a row (seeds SEED, SEED+1, ...)")
    p.add_argument("--hostile", action="store_true",
                   help="mix in requests the gate must refuse (oversized, bad key, huge n, slow-to-"
                        "compile schema, deep JSON) and a slow body; the server gets a random key")
    add_out(p, default="benchmarks/results/soak.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import soak

    result = soak.run(args.model, duration_s=args.duration, max_requests=args.max_requests,
                      clients=args.clients, max_model_len=args.max_model_len,
                      serve_args=["--enforce-eager"] if args.enforce_eager else [],
                      base_url=args.base_url, server_pid=args.server_pid, out=args.out,
                      warmup_s=args.warmup, seed=args.seed, repeat=args.repeat,
                      hostile=args.hostile)
    keys = ("requests", "wall_s", "by_class", "errors", "http_5xx", "ttft_s", "tpot_s", "rss_anon",
            "health_after", "passed")
    for r in result.get("runs", [result]):
        print(json.dumps({k: r[k] for k in keys}, indent=2))
    if "runs" in result:
        print(json.dumps({k: result[k] for k in ("repeat", "clean_runs", "clean_in_a_row", "passed")}))
    return 0 if result["passed"] else 1
