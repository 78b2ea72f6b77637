"""`vllm-edge bench init-memory`: ready time and tree RssAnon by start-up phase.

Each rep runs in a fresh child, `vllm-edge bench init-memory --child ...`, whose switches
(`--kv-gib`, `--no-release`, `--multiprocess`) turn single levers off for a grid arm.
"""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_model, add_out
from vllm_edge.common.errors import UsageError

NAME = "init-memory"
HELP = "ready time and tree RssAnon by start-up phase"


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--context-len", type=int, default=1024, help="tokens that fill the KV cache")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--multiprocess", action="store_true", help="vLLM's default processes")
    p.add_argument("--enforce-eager", action="store_true")
    add_out(p, default="benchmarks/results/init_memory.jsonl")
    child = p.add_argument_group("one rep in this process (what each rep runs; a grid arm)")
    child.add_argument("--child", action="store_true",
                       help="run one rep here and print its JSON line (--out and --reps unused)")
    child.add_argument("--kv-gib", type=int, default=None,
                       help="size the KV cache as stock vLLM does, VLLM_CPU_KVCACHE_SPACE=N GiB")
    child.add_argument("--no-release", action="store_true", help="do not ask the worker to trim arenas")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import init_memory

    if args.child:
        return init_memory.child(args.model, max_model_len=args.max_model_len,
                                 context_len=args.context_len, multiprocess=args.multiprocess,
                                 enforce_eager=args.enforce_eager, kv_gib=args.kv_gib,
                                 release=not args.no_release)
    if args.kv_gib is not None or args.no_release:
        raise UsageError("--kv-gib and --no-release need --child")
    records = init_memory.run(model=args.model, reps=args.reps, context_len=args.context_len,
                              max_model_len=args.max_model_len, multiprocess=args.multiprocess,
                              enforce_eager=args.enforce_eager, out=args.out)
    return 0 if all(r["returncode"] == 0 for r in records) else 1
