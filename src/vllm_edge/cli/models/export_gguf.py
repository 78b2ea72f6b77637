"""`vllm-edge models export-gguf DIR OUT.gguf [--quantize Q4_K_M,...]`."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_threads

NAME = "export-gguf"
HELP = "write a GGUF (BF16/F16) from a bf16 safetensors Llama directory"
DESCRIPTION = ("Writes OUT with the gguf library, then each --quantize type with "
               "llama.cpp's own quantizer as OUT-stem.TYPE.gguf.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC_DIR")
    p.add_argument("out", metavar="OUT.gguf")
    p.add_argument("--type", choices=("bf16", "f16"), default="bf16",
                   help="matrix weight type (default bf16)")
    p.add_argument("--quantize", default=None, metavar="Q4_K_M,Q4_0,Q8_0",
                   help="also quantize with llama.cpp (needs llama-cpp-python)")
    p.add_argument("--tokenizer-pre", default=None, metavar="NAME",
                   help="llama.cpp pre-tokenizer name, when it cannot be recognised from tokenizer.json")
    add_threads(p, help="quantization threads (default: allowed cores)")
    p.add_argument("--force", action="store_true",
                   help="replace OUT (and its quantized siblings) even if vllm-edge did not write them")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models.gguf_export import export_all, parse_quants

    paths = export_all(args.src, args.out, out_type=args.type, quants=parse_quants(args.quantize),
                       tokenizer_pre=args.tokenizer_pre, threads=args.threads, force=args.force)
    for p in paths:
        print(p)
    return 0
