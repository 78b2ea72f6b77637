"""`vllm-edge models prepare`: convert an embedded model, or quantize a model folder (cached,
idempotent)."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_group, add_quant

NAME = "prepare"
HELP = "convert an embedded model, or quantize a model folder (cached, idempotent)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default="default",
                   help="embedded model key, 'default', or a Hugging Face model folder")
    p.add_argument("--force", action="store_true", help="convert again even if cached")
    add_quant(p, help="also build it in this format (cached beside the bf16 directory; an embedded "
                          "model's cpu_int4 at group 32 keeps its GGUF's codes); a folder needs it")
    add_group(p)


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models import store

    if not (args.name == "default" or args.name in store.MODELS):
        if not args.quant:
            raise store.ModelNotAvailable(f"{args.name}: a model folder runs as stored; pass "
                                          "--quant cpu_int4 to build it for this CPU")
        path = store.prepare_folder(args.name, args.quant, args.group, force=args.force)
    elif args.quant:
        path = store.prepare_embedded(args.name, args.quant, args.group, force=args.force)
    else:
        path = store.prepare(args.name, force=args.force)
    print(path)
    return 0
