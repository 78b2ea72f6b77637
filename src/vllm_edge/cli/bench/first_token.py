"""`vllm-edge bench first-token`: command to first token with a warm keep-alive server."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out

NAME = "first-token"
HELP = "wall from `vllm-edge run --prompt` to its first answer byte, warm server; `--help` wall"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--passes", type=int, default=7)
    p.add_argument("--keep-alive", default="10m")
    p.add_argument("--enforce-eager", action="store_true",
                   help="start the server (if none is up) without torch.compile")
    add_out(p, default="benchmarks/results/first_token.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import first_token
    from vllm_edge.common.errors import EdgeError

    if args.passes < 1:
        raise EdgeError(f"--passes {args.passes}: must be at least 1")
    result = first_token.run(args.model, passes=args.passes, keep_alive=args.keep_alive,
                             enforce_eager=args.enforce_eager,
                             out=args.out)
    keys = ("run_first_token_s_median", "run_wall_s_median", "help_wall_s_median",
            "client_imports", "met")
    print(json.dumps({k: result[k] for k in keys}, indent=2))
    return 0 if all(result["met"].values()) else 1
