"""`vllm-edge bench sampling`: coherent answers at the sampling a user gets by default."""

from __future__ import annotations

import argparse
import json
import sys

from vllm_edge.cli.args import add_out

NAME = "sampling"
HELP = ("coherent answers at the default sampling: vLLM's served defaults (compiled, eager as a "
        "first start serves, and on the unquantized model), the chat's old ones, llama.cpp's")
ARMS = ("vllm-defaults", "vllm-defaults-eager", "vllm-defaults-bf16", "vllm-chat-before",
        "vllm-generic-system", "llamacpp-python", "llamacpp-server")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--gguf", default=None,
                   help="the GGUF file llama.cpp's arms run (default: the embedded model's own file)")
    p.add_argument("--samples", type=int, default=3, help="answers per prompt and arm")
    p.add_argument("--france", type=int, default=10, help="times the capital-of-France question is asked")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--system", default=None,
                   help="the system message every arm sends ('' for none: each engine applies the "
                        "chat template's own default; default: what run sends for the model)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    add_out(p, help="write the full result JSON with provenance here (default: benchmarks/results/sampling/"
                    "<this host>.json)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import sampling_defaults
    from vllm_edge.bench.compare import host_artifact
    from vllm_edge.common.errors import UsageError
    from vllm_edge.serving.run import system_message

    arms = tuple(a for a in args.arms.split(",") if a)
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise UsageError(f"--arms {args.arms!r}: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(ARMS)}")
    if args.samples < 1 or args.france < 1 or args.max_tokens < 1:
        raise UsageError("--samples, --france and --max-tokens must be at least 1")
    system = system_message(args.model, args.system)[0]  # what run sends; '' for none
    result = sampling_defaults.run(args.model, gguf=args.gguf, samples=args.samples, france=args.france,
                                   max_tokens=args.max_tokens, arms=arms, system=system,
                                   out=args.out or host_artifact("benchmarks/results/sampling"),
                                   say=lambda m: print(f"[bench sampling] {m}", file=sys.stderr))
    print(json.dumps({arm: {"coherent": f"{a['coherent']}/{a['asked']}",
                            "france": f"{a['france']['coherent']}/{a['france']['asked']}"}
                      for arm, a in result["arms"].items()}, indent=2))
    return 0
