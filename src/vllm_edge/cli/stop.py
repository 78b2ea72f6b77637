"""`vllm-edge stop`: stop keep-alive model servers."""

from __future__ import annotations

import argparse

from vllm_edge.common.errors import EdgeError

NAME = "stop"
HELP = "stop the keep-alive model server of MODEL, or --all"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="the model given to `run` (an embedded key, a path)")
    p.add_argument("--all", action="store_true", help="every running server")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.serving import keepalive

    if (args.model is None) == (not args.all):
        raise EdgeError("name a MODEL or give --all (`vllm-edge ps` lists them)")
    live = [rec for rec, _ in keepalive.records()]
    if args.model is not None:
        want = keepalive.model_id(args.model)  # any weight path
        live = [r for r in live if keepalive.model_id(r.model) == want]
        if not live:
            raise EdgeError(f"no model server is running for {args.model} (`vllm-edge ps`)",
                            exit_code=1)
    for rec in live:
        keepalive.stop(rec)
        print(f"stopped {rec.model} ({rec.quant}) pid {rec.pid} on port {rec.port}")
    return 0
