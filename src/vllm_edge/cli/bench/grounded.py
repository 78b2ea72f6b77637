"""`vllm-edge bench grounded`: decode speed on answers that copy from their prompt, speculative
decoding off against on, as a rotated grid (or one arm, with --arm)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_edge.cli.args import add_model

NAME = "grounded"
HELP = "decode tok/s on answers that copy from their prompt, and on plain chat: speculation off vs on"
DEFAULT_BASE = "benchmarks/results/grounded"


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench import grounded
    from vllm_edge.runtime.speculative import METHODS

    add_model(p, default="default", help="the model `run` would load (default: the embedded one)")
    p.add_argument("--arm", choices=(*METHODS, *grounded.LLAMACPP_ARMS), default=None,
                   help="measure one engine with this --speculative (or llama.cpp on the model's "
                        "GGUF, plain or with llama-cpp-python's prompt lookup) and print its JSON "
                        "line (what the grid runs); default: the grid of every arm")
    p.add_argument("--no-llamacpp", action="store_true",
                   help="leave the llama.cpp arms out of the grid (they run when llama-cpp-python "
                        "is installed)")
    p.add_argument("--passes", type=int, default=3, help="rotated passes per arm (default: %(default)s)")
    p.add_argument("--reps", type=int, default=grounded.REPS,
                   help="timed repetitions inside one engine (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=grounded.MAX_TOKENS)
    p.add_argument("--enforce-eager", action="store_true", help="engines without torch.compile")
    p.add_argument("--allow-busy", action="store_true", help="measure on a busy host, every pass flagged")
    p.add_argument("--out", default=None,
                   help=f"grid output directory (default: {DEFAULT_BASE}/<this host>/)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vllm_edge.bench import grounded
    from vllm_edge.common.errors import UsageError

    if args.passes < 1 or args.reps < 1 or args.max_tokens < 2:
        raise UsageError("--passes and --reps must be at least 1, --max-tokens at least 2")
    if args.arm:
        result = grounded.run(args.model, args.arm, reps=args.reps, max_tokens=args.max_tokens,
                              enforce_eager=args.enforce_eager)
        print(json.dumps(grounded.metric_line(result)))
        return 0

    from vllm_edge.bench import compare
    from vllm_edge.bench.engines import llamacpp as llamacpp_engine
    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.common import atomic
    from vllm_edge.runtime.speculative import METHODS

    cores = sorted(os.sched_getaffinity(0))
    host = compare.this_host(cores)
    out = Path(args.out) if args.out else Path(DEFAULT_BASE) / compare.host_slug(host)
    compare.refuse_other_host(out, host, summary="summary.json")
    arm_cmd = ["python", "-m", "vllm_edge.cli", "bench", "grounded", "--model", args.model, "--reps", str(args.reps),
               "--max-tokens", str(args.max_tokens), *(["--enforce-eager"] if args.enforce_eager else [])]
    spec = {"name": "grounded",
            "description": "bench grounded: greedy decode tok/s per category on answers that copy "
                           "from their prompt, plain chat, and every prompt at once (batch "
                           f"{grounded.BATCH}), speculative decoding off against each method.",
            "metrics": ["grounded_tps", "chat_tps", "batch_tps",
                        *[f"{c}_tps" for c in grounded.GROUNDED], "accepted_share", "load_s",
                        "peak_rss_anon_mb"],
            "pairs": [["off", m] for m in METHODS if m != "off"],
            "timeout_s": 1800,
            "arms": [{"name": m, "cmd": [*arm_cmd, "--arm", m], "env": {}} for m in METHODS]}
    if not args.no_llamacpp and llamacpp_engine.available():
        grounded.model_gguf(args.model)  # a model without a GGUF is refused before any arm runs
        spec["arms"] += [{"name": m, "cmd": [*arm_cmd, "--arm", m], "env": {}} for m in grounded.LLAMACPP_ARMS]
        spec["pairs"] += [[m, "auto"] for m in grounded.LLAMACPP_ARMS]
        spec["description"] += (" llama.cpp on the model's GGUF, plain and with llama-cpp-python's "
                                "prompt lookup, is decoded through the same timings (no batch figure).")
    summary = grid.run_grid(spec, args.passes, out, allow_busy=args.allow_busy, warmup=True,
                            log=lambda m: print(f"[bench grounded] {m}", file=sys.stderr))
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line]
    summary["same_answers"] = {m: grounded.same_answers([r for r in records if not r.get("warmup")], ("off", m))
                               for m in METHODS if m != "off"}
    summary["command"] = "vllm-edge bench grounded " + " ".join(sys.argv[3:])
    atomic.write_json(out / "summary.json", summary)
    print(grid.format_summary(summary))
    print(json.dumps(summary["same_answers"], indent=2))
    return 0
