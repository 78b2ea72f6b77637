"""`vllm-edge bench llamacpp --gguf F`: `bench speed`'s metrics for a GGUF under llama.cpp.

Runs in its own process so its tree RssAnon is llama.cpp's alone; the last stdout line is
one JSON object with `bench speed`'s key names (a `vllm-edge grid` arm).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_edge.cli.args import add_cpus, add_json_schema, add_out, add_threads
from vllm_edge.common.errors import EdgeError

NAME = "llamacpp"
HELP = "llama.cpp as a grid arm: bench speed's metrics for a GGUF (needs the [baselines] extra)"
DESCRIPTION = "The llama.cpp arm: `bench speed`'s metrics for a GGUF under llama-cpp-python."


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gguf", required=True, help="GGUF file to run")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--tg-tokens", type=int, default=128)
    p.add_argument("--context-len", default=None, metavar="N[,N...]", help="also tg at depth N")
    p.add_argument("--batch", default=None, metavar="B[,B...]",
                   help="also b{B}_tg_tps: B distinct prompts decoded together")
    add_threads(p, help="first N cores of the core set")
    add_cpus(p)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--no-mmap", action="store_true", help="read weights into anonymous memory")
    add_json_schema(p)
    add_out(p)


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import speed
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.bench.llamacpp import arm
    from vllm_edge.cli.args import reported
    from vllm_edge.common.pinning import core_set, parse_int_list, pin

    cfg = speed.SpeedConfig(
        model=args.gguf, prompt_len=args.prompt_len, tg_tokens=args.tg_tokens,
        context_lens=parse_int_list(args.context_len, "--context-len"),
        batches=parse_int_list(args.batch, "--batch"), reps=args.reps,
        threads=args.threads, cpus=parse_int_list(args.cpus, "--cpus", minimum=0) or None,
        dtype="gguf", warmup=not args.no_warmup, json_schema=args.json_schema)
    with reported(speed.SpeedArgError):
        speed.validate(cfg)
    cores = core_set(cfg.cpus, cfg.threads, sorted(os.sched_getaffinity(0)))
    if not llamacpp_runner.available():
        raise EdgeError(llamacpp_runner.SKIP_REASON)
    pinning = pin(cores)
    print(f"[llama.cpp] pinned to cores {cores}, {len(cores)} threads", file=sys.stderr)
    with reported(FileNotFoundError):
        result = arm.run(args.gguf, cfg, pinning=pinning, use_mmap=not args.no_mmap, out=args.out)
    print(speed.format_table(result), file=sys.stderr)
    print(json.dumps(arm.metric_line(result)), flush=True)
    return 0
