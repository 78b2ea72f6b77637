"""`vllm-edge models synthetic OUT`: a checkpoint with random weights."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import reported

NAME = "synthetic"
HELP = "a bf16 checkpoint with random weights (Llama, Qwen2 or Qwen3)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out")
    p.add_argument("--arch", choices=("llama", "qwen2", "qwen3"), default="llama",
                   help="qwen2 adds q/k/v biases, qwen3 per-head q/k RMSNorm (default llama)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--intermediate", type=int, default=None, help="default: 2.75x hidden")
    p.add_argument("--heads", type=int, default=None, help="default: hidden / 64")
    p.add_argument("--kv-heads", type=int, default=None, help="default: heads / 4")
    p.add_argument("--tied", action=argparse.BooleanOptionalAction, default=True,
                   help="tie the head to the embedding (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true",
                   help="replace OUT even if it is not a synthetic build vllm-edge made")
    p.add_argument("--tokenizer-from", default=None,
                   help="model directory whose tokenizer to reuse (default: the embedded model)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models import store, synthetic

    with reported(ValueError, FileNotFoundError):
        shape = synthetic.Shape.derive(args.hidden, args.layers, args.vocab, args.intermediate,
                                       args.heads, args.kv_heads, args.tied, args.arch)
        tok = args.tokenizer_from or store.prepare("default")
        path = synthetic.build(args.out, shape, tokenizer_from=tok, seed=args.seed, force=args.force)
    print(path)
    return 0
