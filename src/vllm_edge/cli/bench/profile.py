"""`vllm-edge bench profile`: torch.profiler breakdown of one prefill and one decode."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_edge.cli.args import (
    add_cpus,
    add_group,
    add_model,
    add_out,
    add_quant,
    add_threads,
    add_torch_dtype,
)
from vllm_edge.cli.bench.speed import model_and_cores, pin_cores
from vllm_edge.common.errors import EdgeError

NAME = "profile"
HELP = "torch.profiler breakdown of one prefill and one decode, by op and group"
DESCRIPTION = ("Starts the `bench speed` engine in one process and eager mode, warms up, then "
               "profiles (CPU activities) one --prompt-len prefill with max_tokens=1 and "
               "--decode-tokens decode steps on a 16-token prompt. Writes self CPU time per "
               "op and per group (linear, attention, norm, activation, embed_head, sampling, "
               "other, untraced) as ms and % of the phase's wall time. Under contention "
               "compare the % columns, not the ms.")


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    add_quant(p, help="run the embedded model's quantized build (made once and cached)")
    add_group(p, help="group size for --quant")
    add_torch_dtype(p)
    p.add_argument("--prompt-len", type=int, default=512, help="prefill tokens (default 512)")
    p.add_argument("--decode-tokens", type=int, default=32,
                   help="decode steps profiled after the first token (default 32)")
    p.add_argument("--top", type=int, default=15, help="ops listed per phase (default 15)")
    p.add_argument("--warmup", type=int, default=1, help="unprofiled prefill+decode rounds first (default 1)")
    add_threads(p)
    add_cpus(p)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="engine max_model_len (default: what the run needs)")
    add_out(p, help="result JSON (default benchmarks/results/profile_<build>_pp<N>_tg<M>.json)")
    p.add_argument("--compare", nargs="+", metavar="RESULT.json", default=None,
                   help="print the group shares of saved results side by side; runs no engine")
    p.add_argument("--labels", default=None, metavar="A,B,...",
                   help="column labels for --compare (default: the file names)")


def run(args: argparse.Namespace) -> int:
    """ProfileError from a saved result is exit 2; from the profiled run, exit 1."""
    from vllm_edge.bench import profile
    from vllm_edge.common.pinning import parse_int_list

    if args.compare:
        results = [profile.load(p) for p in args.compare]
        labels = args.labels.split(",") if args.labels else [Path(p).stem for p in args.compare]
        print(profile.format_comparison(results, labels))
        return 0
    cfg = profile.ProfileConfig(
        model=args.model, quant=args.quant, group=args.group, dtype=args.dtype,
        prompt_len=args.prompt_len, decode_tokens=args.decode_tokens, top=args.top,
        warmup=args.warmup, threads=args.threads,
        cpus=parse_int_list(args.cpus, "--cpus", minimum=0) or None, max_model_len=args.max_model_len)
    profile.validate(cfg)
    _, cores = model_and_cores(cfg.speed_config())
    pinning = pin_cores(cores, "profile")
    try:
        result = profile.run(cfg, pinning=pinning, out=args.out)
    except profile.ProfileError as exc:
        raise EdgeError(str(exc), exit_code=1) from exc
    print(profile.format_table(result), flush=True)
    print(f"[profile] wrote {result['out']}", file=sys.stderr)
    return 0
