"""`vllm-edge bench speed` and `bench profile`: flags, pinning, and output for
:mod:`speed` and :mod:`profile` (which starts the same engine).

`bench speed` prints its table to stderr; its last stdout line is one JSON object, so the
command works as a `vllm-edge grid` arm. `bench profile` prints its tables to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vllm_edge.bench import speed
from vllm_edge.common.errors import UsageError
from vllm_edge.common.pinning import core_set, parse_int_list, pin
from vllm_edge.quant.groups import DEFAULT_GROUP, GROUPS


def config_from_args(args: argparse.Namespace) -> speed.SpeedConfig:
    return speed.SpeedConfig(
        model=args.model, prompt_len=args.prompt_len, tg_tokens=args.tg_tokens,
        context_lens=parse_int_list(args.context_len, "--context-len"),
        batches=parse_int_list(args.batch, "--batch"),
        reps=args.reps, threads=args.threads,
        cpus=parse_int_list(args.cpus, "--cpus") or None,
        enforce_eager=args.enforce_eager, dtype=args.dtype, max_model_len=args.max_model_len,
        warmup=not args.no_warmup, bandwidth=args.bandwidth, quant=args.quant, group=args.group,
        image_px=args.image_px)


def _model_and_cores(cfg: speed.SpeedConfig) -> tuple[Path, list[int]]:
    """The checkpoint `bench speed`/`bench profile` will run, checked against the config, and
    the cores to pin; raises the errors the commands report with exit 2."""
    path = speed.model_path(cfg)
    speed.validate(cfg, speed.model_max_len(path))
    return path, core_set(cfg.cpus, cfg.threads, sorted(os.sched_getaffinity(0)))


def _pin(cores: list[int], tag: str) -> dict:
    pinning = pin(cores)
    print(f"[{tag}] pinned to cores {cores}, OMP_NUM_THREADS={pinning['OMP_NUM_THREADS']}",
          file=sys.stderr)
    return pinning


def _cmd_speed(args: argparse.Namespace) -> int:
    from vllm_edge.bench.bytes_per_token import AccountingError
    from vllm_edge.models.store import ModelNotAvailable

    try:
        cfg = config_from_args(args)
        path, cores = _model_and_cores(cfg)
        if cfg.image_px:
            speed.image_token_id(path)
        if cfg.bandwidth not in ("auto", "measure", "off") and not Path(cfg.bandwidth).is_file():
            raise speed.SpeedArgError(f"--bandwidth {cfg.bandwidth}: no such file "
                                      "(give auto, measure, off or a `vllm-edge bandwidth` result)")
    except (UsageError, ModelNotAvailable, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pinning = _pin(cores, "speed")
    try:
        result = speed.run(cfg, pinning=pinning, out=args.out)
    except (UsageError, AccountingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(speed.format_table(result), file=sys.stderr)
    if args.out:
        print(f"[speed] wrote {args.out}", file=sys.stderr)
    # Last stdout line: vLLM logs to stdout too, and the grid reads the last JSON line.
    print(json.dumps(speed.metric_line(result)), flush=True)
    return 0


def _bench_subparsers(sub: "argparse._SubParsersAction") -> "argparse._SubParsersAction":
    bench = sub.choices["bench"]
    for action in bench._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the 'bench' command has no subcommands")


def add_speed_commands(sub: "argparse._SubParsersAction") -> None:
    s = _bench_subparsers(sub).add_parser(
        "speed", help="llama-bench-style pp/tg throughput (best and median over reps)",
        description="pp: a --prompt-len prompt with max_tokens=1. tg: --tg-tokens tokens with "
                    "ignore_eos minus a 1-token run on the same prompt, over tg-1 tokens. "
                    "Prefix caching is off. The last stdout line is one JSON object.")
    s.add_argument("--model", default="default", help="'default', an embedded key, or a model directory")
    s.add_argument("--prompt-len", type=int, default=512, help="pp prompt tokens (default 512)")
    s.add_argument("--tg-tokens", type=int, default=128, help="tokens generated per tg run (default 128)")
    s.add_argument("--context-len", default=None, metavar="N[,N...]",
                   help="also measure tg on a prompt of N tokens (decode at depth)")
    s.add_argument("--batch", default=None, metavar="B[,B...]",
                   help="also measure total tg throughput with B concurrent distinct sequences")
    s.add_argument("--threads", type=int, default=None,
                   help="use the first N cores of the core set (vLLM binds one thread per core)")
    s.add_argument("--cpus", default=None, metavar="0,1", help="core set (default: our affinity)")
    s.add_argument("--reps", type=int, default=3, help="repetitions per metric (default 3)")
    s.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--max-model-len", type=int, default=None,
                   help="engine max_model_len (default: what the longest run needs)")
    s.add_argument("--no-warmup", action="store_true", help="time the first calls too")
    s.add_argument("--quant", choices=("cpu_int4", "gptq"), default=None,
                   help="run the embedded model's quantized build (made once and cached, as `run` does)")
    s.add_argument("--group", type=int, choices=GROUPS, default=DEFAULT_GROUP, help="group size for --quant")
    s.add_argument("--bandwidth", default="auto", metavar="auto|measure|off|FILE",
                   help="read-bandwidth ceiling for pct_of_ceiling: auto = "
                        "benchmarks/results/bandwidth.json when measured on the same cores (else "
                        "none, with the reason), measure = run `vllm-edge bandwidth` first, "
                        "or a bandwidth result file (default %(default)s)")
    s.add_argument("--image-px", type=int, default=None, metavar="PX",
                   help="vision-language models: also time the prefill of one PX-by-PX image "
                        "(img{PX}_prefill_s) and tg with it in context (tg{N}_img_tps)")
    s.add_argument("--out", default=None, help="write the full result JSON with provenance here")
    s.set_defaults(func=_cmd_speed)


def _cmd_profile(args: argparse.Namespace) -> int:
    from vllm_edge.bench import profile
    from vllm_edge.models.store import ModelNotAvailable

    if args.compare:
        try:
            results = [profile.load(p) for p in args.compare]
        except profile.ProfileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        labels = args.labels.split(",") if args.labels else [Path(p).stem for p in args.compare]
        try:
            print(profile.format_comparison(results, labels))
        except profile.ProfileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        cfg = profile.ProfileConfig(
            model=args.model, quant=args.quant, group=args.group, dtype=args.dtype,
            prompt_len=args.prompt_len, decode_tokens=args.decode_tokens, top=args.top,
            warmup=args.warmup, threads=args.threads,
            cpus=parse_int_list(args.cpus, "--cpus") or None, max_model_len=args.max_model_len)
        profile.validate(cfg)
        _, cores = _model_and_cores(cfg.speed_config())
    except (UsageError, ModelNotAvailable, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pinning = _pin(cores, "profile")
    try:
        result = profile.run(cfg, pinning=pinning, out=args.out)
    except profile.ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(profile.format_table(result), flush=True)
    print(f"[profile] wrote {result['out']}", file=sys.stderr)
    return 0


def add_profile_commands(sub: "argparse._SubParsersAction") -> None:
    s = _bench_subparsers(sub).add_parser(
        "profile", help="torch.profiler breakdown of one prefill and one decode, by op and group",
        description="Starts the `bench speed` engine in one process and eager mode, warms up, then "
                    "profiles (CPU activities) one --prompt-len prefill with max_tokens=1 and "
                    "--decode-tokens decode steps on a 16-token prompt. Writes self CPU time per "
                    "op and per group (linear, attention, norm, activation, embed_head, sampling, "
                    "other, untraced) as ms and % of the phase's wall time. Under contention "
                    "compare the % columns, not the ms.")
    s.add_argument("--model", default="default", help="'default', an embedded key, or a model directory")
    s.add_argument("--quant", choices=("cpu_int4", "gptq"), default=None,
                   help="run the embedded model's quantized build (made once and cached)")
    s.add_argument("--group", type=int, choices=GROUPS, default=DEFAULT_GROUP, help="group size for --quant")
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--prompt-len", type=int, default=512, help="prefill tokens (default 512)")
    s.add_argument("--decode-tokens", type=int, default=32,
                   help="decode steps profiled after the first token (default 32)")
    s.add_argument("--top", type=int, default=15, help="ops listed per phase (default 15)")
    s.add_argument("--warmup", type=int, default=1, help="unprofiled prefill+decode rounds first (default 1)")
    s.add_argument("--threads", type=int, default=None,
                   help="use the first N cores of the core set (vLLM binds one thread per core)")
    s.add_argument("--cpus", default=None, metavar="0,1", help="core set (default: our affinity)")
    s.add_argument("--max-model-len", type=int, default=None,
                   help="engine max_model_len (default: what the run needs)")
    s.add_argument("--out", default=None,
                   help="result JSON (default benchmarks/results/profile_<build>_pp<N>_tg<M>.json)")
    s.add_argument("--compare", nargs="+", metavar="RESULT.json", default=None,
                   help="print the group shares of saved results side by side; runs no engine")
    s.add_argument("--labels", default=None, metavar="A,B,...",
                   help="column labels for --compare (default: the file names)")
    s.set_defaults(func=_cmd_profile)
