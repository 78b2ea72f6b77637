"""`vllm-edge bandwidth`: achievable memory read bandwidth on the core set."""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_edge.bench import bandwidth as bw
from vllm_edge.cli.args import add_cpus, add_out, add_threads

NAME = "bandwidth"
HELP = "achievable memory read bandwidth on the core set (the bytes/token ceiling)"
DESCRIPTION = ("Streaming reductions over a buffer much larger than the last-level cache, "
               "on N pinned threads like `bench speed`. The ceiling is the best pass; "
               "`bench speed` reads it back for the same cores.")


def add_args(p: argparse.ArgumentParser) -> None:
    add_threads(p, help="use the first N cores of the core set (as `bench speed`)")
    add_cpus(p)
    p.add_argument("--buffer-mib", type=int, default=None,
                   help=f"buffer size (default: max({bw.MIN_BUFFER_MIB} MiB, "
                        f"{bw.DEFAULT_LLC_MULTIPLE}x the LLC))")
    p.add_argument("--reps", type=int, default=bw.DEFAULT_REPS,
                   help="passes per kernel (default %(default)s)")
    p.add_argument("--allow-in-cache", action="store_true",
                   help=f"accept a buffer under {bw.MIN_LLC_MULTIPLE}x the LLC (a test run; not a ceiling)")
    add_out(p, default=None, help=f"result JSON (default {bw.DEFAULT_DIR}/<host>.json; '' for none)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.common import pinning
    from vllm_edge.common.errors import UsageError

    cpus = pinning.parse_int_list(args.cpus, "--cpus", minimum=0) or None
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")
    cores = pinning.core_set(cpus, args.threads, sorted(os.sched_getaffinity(0)))
    if args.reps < 1:
        raise bw.BandwidthError("--reps must be at least 1")
    if args.buffer_mib is not None and args.buffer_mib < 1:
        raise bw.BandwidthError("--buffer-mib must be at least 1")
    if args.out is None:
        args.out = bw.default_out(cores)
    pinned = pinning.pin(cores)
    result = bw.run(buffer_bytes=args.buffer_mib << 20 if args.buffer_mib else None, reps=args.reps,
                    pinning=pinned, allow_in_cache=args.allow_in_cache, out=args.out)
    print(bw.format_table(result), file=sys.stderr)
    if args.out:
        print(f"[bandwidth] wrote {args.out}", file=sys.stderr)
    line = {"benchmark": "bandwidth", "build": result["build"], bw.METRIC: result["median_gb_per_s"],
            "ceiling_gb_per_s": result["ceiling_gb_per_s"], "in_cache": result["in_cache"]}
    if result.get("out"):
        line["out"] = result["out"]
    print(json.dumps(line), flush=True)
    return 0
