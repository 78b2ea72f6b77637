"""`vllm-edge bench startup`: a warm in-process `run`, phase by phase, to first token."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out

NAME = "startup"
HELP = "warm `run --keep-alive 0`: each phase from process start to first token, and RssAnon"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--passes", type=int, default=5, help="measured passes (default %(default)s)")
    p.add_argument("--arm", action="append", default=[], metavar="LABEL[:NAME=VALUE,...]",
                   help="an arm with its own environment, e.g. before:PYTHONPATH=../old-checkout/src; "
                        "repeatable, passes rotate the arms' order (default: one arm, 'default')")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--enforce-eager", action="store_true", help="run without torch.compile")
    add_out(p, default=None, help="artifact (default benchmarks/results/startup/<arm>[_<arm>...].json)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import startup
    from vllm_edge.common.errors import UsageError

    if args.passes < 1:
        raise UsageError(f"--passes {args.passes}: must be at least 1")
    arms: dict[str, dict[str, str]] = {}
    for spec in args.arm or ["default"]:
        label, _, rest = spec.partition(":")
        if not label or label in arms:
            raise UsageError(f"--arm {spec!r}: needs a label of its own")
        env = {}
        for item in filter(None, rest.split(",")):
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise UsageError(f"--arm {spec!r}: {item!r} is not NAME=VALUE")
            env[name] = value
        arms[label] = env
    out = args.out or f"benchmarks/results/startup/{'_'.join(arms)}.json"
    result = startup.run(args.model, passes=args.passes, arms=arms, max_tokens=args.max_tokens,
                         run_flags=["--enforce-eager"] if args.enforce_eager else [], out=out)
    for label, arm in result["arms"].items():
        print(f"== {label} {arm['env'] or ''}")
        print(startup.format_table(arm))
    print(json.dumps({"out": out, **{label: {"ready_s_median": arm["ready_s_median"],
                                            "peak_tree_rss_anon_mb_median": arm["peak_tree_rss_anon_mb_median"],
                                            "met": arm["met"]} for label, arm in result["arms"].items()}}))
    return 0
