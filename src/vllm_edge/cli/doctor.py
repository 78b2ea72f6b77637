"""`vllm-edge doctor`: versions, CPU features, patch states, problems."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_output
from vllm_edge.common.errors import EdgeError

NAME = "doctor"
HELP = "versions, CPU features, patch states, problems"


def add_args(p: argparse.ArgumentParser) -> None:
    add_output(p)
    p.add_argument("--ranks", default=None, metavar="TPxPP",
                   help="also start MODEL eagerly with TP x PP ranks (e.g. 1x2) and report the patch "
                        "states read inside every rank's own process")
    p.add_argument("--model", default="default", help="the model --ranks starts (default: %(default)s)")


def parse_ranks(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        tp, pp = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise EdgeError(f"--ranks {text!r}: expected TPxPP, e.g. 2x1 or 1x2") from None
    if tp < 1 or pp < 1:
        raise EdgeError(f"--ranks {text!r}: both sizes must be at least 1")
    return tp, pp


def run(args: argparse.Namespace) -> int:
    from vllm_edge import doctor

    return doctor.main(as_json=args.output == "json", ranks=parse_ranks(args.ranks), model=args.model)
