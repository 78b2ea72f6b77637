"""`vllm-edge models rm`: remove cached builds."""

from __future__ import annotations

import argparse

NAME = "rm"
HELP = "remove builds from the cache (names as `models list` prints them)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("builds", nargs="+", metavar="BUILD", help="a build's name or its directory")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models import cache

    targets = [cache.find(n) for n in args.builds]  # every name checked before anything goes
    for b in targets:
        cache.remove(b.name)
        print(f"removed {b.name} ({b.bytes / 1e6:.0f} MB)")
    return 0
