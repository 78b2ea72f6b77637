"""`vllm-edge bench step`: wall-clock breakdown of one batch-1 decode step."""

from __future__ import annotations

import argparse
import json
import sys

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
from vllm_edge.quant.formats.cpu_int4 import NAME as CPU_INT4
from vllm_edge.quant.formats.gptq import NAME as GPTQ

NAME = "step"
HELP = "where one batch-1 decode step's wall time goes: scheduler, inputs, forward, head, sampler, output"
DESCRIPTION = ("Starts the `bench speed` engine in one process (compiled unless --eager), warms up, "
               "then steps one greedy request --steps times with wall-clock timers on the "
               "scheduler, the runner's input preparation, the forward, the head, the sampler and "
               "the output processing; counts dispatcher ops per step (Python-implemented vllm:: ops "
               "apart) under torch.profiler; and times the cpu_int4 op's call path at one row. "
               "The last stdout line is a JSON object of medians, for `vllm-edge grid`.")


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    add_quant(p, choices=(CPU_INT4, GPTQ, "none"), default=CPU_INT4,
              help=f"the embedded model's build (default {CPU_INT4}; 'none' for the unquantized checkpoint)")
    add_group(p, help="group size for --quant")
    add_torch_dtype(p)
    p.add_argument("--steps", type=int, default=64, help="decode steps timed (default 64)")
    p.add_argument("--warmup", type=int, default=16, help="decode steps of a warm-up request first (default 16)")
    p.add_argument("--eager", action="store_true", help="enforce_eager (default: the compiled graph)")
    p.add_argument("--dispatch-calls", type=int, default=2000,
                   help="calls per round of the int4 op call-path timing; 0 skips it (default 2000)")
    add_threads(p)
    add_cpus(p)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="engine max_model_len (default: what the run needs)")
    add_out(p, help="result JSON (default benchmarks/results/step/<build>_<mode>.json)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import step
    from vllm_edge.bench.compare import refuse_other_hosts_file
    from vllm_edge.common.pinning import parse_int_list

    quant = None if args.quant == "none" else args.quant
    cfg = step.StepConfig(model=args.model, quant=quant, group=args.group, dtype=args.dtype,
                          steps=args.steps, warmup=args.warmup, enforce_eager=args.eager,
                          threads=args.threads, cpus=parse_int_list(args.cpus, "--cpus", minimum=0) or None,
                          max_model_len=args.max_model_len, dispatch_calls=args.dispatch_calls)
    step.validate(cfg)
    path, cores = model_and_cores(cfg.speed_config())
    pinning = pin_cores(cores, "step")
    out = args.out or step.default_out(path, cfg)
    refuse_other_hosts_file(out)
    try:
        result = step.run(cfg, pinning=pinning, out=out)
    except step.StepError as exc:
        raise EdgeError(str(exc), exit_code=1) from exc
    print(step.format_table(result), file=sys.stderr)
    print(f"[step] wrote {result['out']}", file=sys.stderr)
    # Last stdout line: the grid reads it.
    print(json.dumps(step.metric_line(result)), flush=True)
    return 0
