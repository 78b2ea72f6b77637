"""`vllm-edge bench server`: the keep-alive server's start to first token and its memory."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys

from vllm_edge.cli.args import add_out

NAME = "server"
HELP = "the keep-alive server run starts: spawn to first token (warm caches) and RssAnon per process"
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
OPTION_WORD = re.compile(r"^[a-z_][a-z0-9_]*=")  # a keyword of serve.main, as run passes it


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--arm", action="append", default=None, metavar="NAME:WORDS",
                   help="an arm: a name, a colon, then vLLM flags, NAME=VALUE environment words and "
                        "key=value server options as run passes them (e.g. 'seqs1:max_num_seqs=1', "
                        "'b512:--max-num-batched-tokens 512'); repeat; default: one arm, the shipped "
                        "settings")
    p.add_argument("--passes", type=int, default=3, help="warm passes per arm (after one that may compile)")
    p.add_argument("--enforce-eager", action="store_true", help="start the servers without torch.compile")
    add_out(p, help="write the full result JSON with provenance here (default: benchmarks/results/server_start/"
                    "<this host>.json)")


def parse_arm(text: str) -> tuple[str, dict]:
    from vllm_edge.common.errors import UsageError

    name, sep, words = text.partition(":")
    if not sep or not name.strip():
        raise UsageError(f"--arm {text!r}: expected NAME:WORDS (WORDS may be empty)")
    try:
        tokens = shlex.split(words)
    except ValueError as exc:
        raise UsageError(f"--arm {text!r}: {exc}") from None
    env = dict(t.split("=", 1) for t in tokens if ENV_WORD.match(t))
    options = {}
    for t in tokens:
        if OPTION_WORD.match(t):
            key, value = t.split("=", 1)
            try:
                options[key] = json.loads(value)
            except ValueError:
                options[key] = value
    flags = [t for t in tokens if not (ENV_WORD.match(t) or OPTION_WORD.match(t))]
    return name.strip(), {"extra": flags, "env": env, "options": options}


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import server_start
    from vllm_edge.bench.compare import host_artifact
    from vllm_edge.common.errors import UsageError

    if args.passes < 1:
        raise UsageError(f"--passes {args.passes}: must be at least 1")
    arms = dict(parse_arm(a) for a in (args.arm or ["shipped:"]))
    out = args.out or host_artifact("benchmarks/results/server_start")
    result = server_start.run(args.model, arms=arms, passes=args.passes, enforce_eager=args.enforce_eager,
                              out=out, say=lambda m: print(f"[bench server] {m}", file=sys.stderr))
    print(json.dumps({name: a["median"] for name, a in result["arms"].items()}, indent=2))
    return 0
