"""`vllm-edge bench scale-prefetch`: the int4 decode product over a whole model's linears, the
scales prefetched some groups ahead against not at all, paired in one process."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_out, add_threads

NAME = "scale-prefetch"
HELP = "the int4 decode product over a model's worth of layers, scale prefetch distances paired"
DESCRIPTION = ("Lays out a model's worth of layers of each shape set (random codes, in huge pages "
               "as the engine has them) and times one row through all of them with each prefetch "
               "distance, back to back in every round; ratios are per round against no prefetch. "
               "Default file: benchmarks/results/scale_prefetch/<host>.json.")
DEFAULT_DIR = "benchmarks/results/scale_prefetch"


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench.micro import scale_stream as ss

    p.add_argument("--sets", default=",".join(ss.SETS),
                   help=f"shape sets, comma-separated (default %(default)s; from {', '.join(ss.SETS)})")
    p.add_argument("--ahead", default=",".join(map(str, ss.DEFAULT_AHEAD)),
                   help="prefetch distances in groups, 0 among them (default %(default)s)")
    p.add_argument("--rounds", type=int, default=30, help="rounds over the distances (default 30)")
    add_threads(p, help="threads (default: the allowed cores)")
    add_out(p, default=None, help=f"result JSON (default {DEFAULT_DIR}/<host>.json; '' for none)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import compare
    from vllm_edge.bench.micro import scale_stream as ss
    from vllm_edge.common import pinning
    from vllm_edge.common.errors import UsageError

    sets = tuple(s.strip() for s in args.sets.split(",") if s.strip())
    ahead = tuple(pinning.parse_int_list(args.ahead, "--ahead", minimum=0) or ())
    if not sets or not ahead:
        raise UsageError("--sets and --ahead need at least one value each")
    out = args.out
    if out is None:
        out = str(compare.host_artifact(DEFAULT_DIR))
        compare.refuse_other_hosts_file(out)
    try:
        return ss.main(sets, ahead, args.rounds, args.threads, out or None)
    except ss.ScaleStreamError as exc:
        raise UsageError(str(exc)) from None
