"""`vllm-edge doctor`: versions, CPU features, patch states, problems."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_output

NAME = "doctor"
HELP = "versions, CPU features, patch states, problems"


def add_args(p: argparse.ArgumentParser) -> None:
    add_output(p)


def run(args: argparse.Namespace) -> int:
    from vllm_edge import doctor

    return doctor.main(as_json=args.output == "json")
