"""`vllm-edge bench speed`: llama-bench-style pp/tg throughput.

Prints its table to stderr; its last stdout line is one JSON object, so the command works
as a `vllm-edge grid` arm. The model/core checks and the pinning here are shared with
`bench profile`, which starts the same engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vllm_edge.bench import speed
from vllm_edge.cli.args import (
    MODEL_HELP,
    add_cpus,
    add_group,
    add_json_schema,
    add_model,
    add_out,
    add_quant,
    add_threads,
    add_torch_dtype,
)
from vllm_edge.common.pinning import core_set, parse_int_list, pin

NAME = "speed"
HELP = "llama-bench-style pp/tg throughput (best and median over reps)"
DESCRIPTION = ("pp: a --prompt-len prompt with max_tokens=1. tg: --tg-tokens tokens with "
               "ignore_eos minus a 1-token run on the same prompt, over tg-1 tokens. "
               "Prefix caching is off. The last stdout line is one JSON object.")


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p, help=MODEL_HELP)
    p.add_argument("--prompt-len", type=int, default=512, help="pp prompt tokens (default 512)")
    p.add_argument("--tg-tokens", type=int, default=128, help="tokens generated per tg run (default 128)")
    p.add_argument("--context-len", default=None, metavar="N[,N...]",
                   help="also measure tg on a prompt of N tokens (decode at depth)")
    p.add_argument("--batch", default=None, metavar="B[,B...]",
                   help="also measure total tg throughput with B concurrent distinct sequences")
    add_threads(p)
    add_cpus(p)
    p.add_argument("--reps", type=int, default=3, help="repetitions per metric (default 3)")
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    add_torch_dtype(p)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="engine max_model_len (default: what the longest run needs)")
    p.add_argument("--no-warmup", action="store_true", help="time the first calls too")
    add_quant(p, help="run the embedded model's quantized build (made once and cached, as `run` does)")
    add_group(p, help="group size for --quant")
    p.add_argument("--bandwidth", default="auto", metavar="auto|measure|off|FILE",
                   help="read-bandwidth ceiling for pct_of_ceiling: auto = "
                        "this host's benchmarks/results/bandwidth/<host>.json when measured on the same "
                        "cores (else "
                        "none, with the reason), measure = run `vllm-edge bandwidth` first, "
                        "or a bandwidth result file (default %(default)s)")
    p.add_argument("--image-px", type=int, default=None, metavar="PX",
                   help="vision-language models: also time the prefill of one PX-by-PX image "
                        "(img{PX}_prefill_s) and tg with it in context (tg{N}_img_tps)")
    add_json_schema(p)
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split every layer over N ranks, one process each, the pinned cores "
                        "shared between them (RssAnon per rank in the result)")
    add_out(p)


def config_from_args(args: argparse.Namespace) -> speed.SpeedConfig:
    return speed.SpeedConfig(
        model=args.model, prompt_len=args.prompt_len, tg_tokens=args.tg_tokens,
        context_lens=parse_int_list(args.context_len, "--context-len"),
        batches=parse_int_list(args.batch, "--batch"),
        reps=args.reps, threads=args.threads,
        cpus=parse_int_list(args.cpus, "--cpus", minimum=0) or None,
        enforce_eager=args.enforce_eager, dtype=args.dtype, max_model_len=args.max_model_len,
        warmup=not args.no_warmup, bandwidth=args.bandwidth, quant=args.quant, group=args.group,
        image_px=args.image_px, tensor_parallel_size=args.tensor_parallel_size,
        json_schema=args.json_schema)


def model_and_cores(cfg: speed.SpeedConfig) -> tuple[Path, list[int]]:
    """The checkpoint `bench speed`/`bench profile` will run, checked against the config, and
    the cores to pin; raises the errors the commands report with exit 2."""
    from vllm_edge.cli.args import reported

    with reported(FileNotFoundError):
        path = speed.model_path(cfg)
        speed.validate(cfg, speed.model_max_len(path))
    return path, core_set(cfg.cpus, cfg.threads, sorted(os.sched_getaffinity(0)))


def pin_cores(cores: list[int], tag: str) -> dict:
    pinning = pin(cores)
    print(f"[{tag}] pinned to cores {cores}, OMP_NUM_THREADS={pinning['OMP_NUM_THREADS']}",
          file=sys.stderr)
    return pinning


def run(args: argparse.Namespace) -> int:
    from vllm_edge.cli.args import reported

    cfg = config_from_args(args)
    path, cores = model_and_cores(cfg)
    with reported(FileNotFoundError):
        if cfg.image_px:
            speed.image_token_id(path)
    if cfg.bandwidth not in ("auto", "measure", "off") and not Path(cfg.bandwidth).is_file():
        raise speed.SpeedArgError(f"--bandwidth {cfg.bandwidth}: no such file "
                                  "(give auto, measure, off or a `vllm-edge bandwidth` result)")
    pinning = pin_cores(cores, "speed")
    result = speed.run(cfg, pinning=pinning, out=args.out)
    print(speed.format_table(result), file=sys.stderr)
    if args.out:
        print(f"[speed] wrote {args.out}", file=sys.stderr)
    # Last stdout line: vLLM logs to stdout too, and the grid reads the last JSON line.
    print(json.dumps(speed.metric_line(result)), flush=True)
    return 0
