"""`vllm-edge bench llamacpp-fidelity`: a quantized GGUF against its own BF16 GGUF, in llama.cpp."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_edge.cli.args import add_out, add_threads
from vllm_edge.common.errors import EdgeError

NAME = "llamacpp-fidelity"
HELP = "fidelity of a quantized GGUF against its BF16 GGUF, both in llama.cpp (needs [baselines])"
DESCRIPTION = ("Fidelity of a quantized GGUF against its own BF16 GGUF, both in llama.cpp "
               "(docs/design/fidelity.md).")


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench.fidelity.defaults import DEFAULT_KL_K

    p.add_argument("--ref", required=True, help="the BF16 GGUF")
    p.add_argument("--cand", required=True, help="the quantized GGUF")
    p.add_argument("--tokenizer", required=True, help="model directory whose tokenizer makes the token ids")
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--chunk-len", type=int, default=512)
    p.add_argument("--prompt-ids", default=None, metavar="ID[,ID...]",
                   help="a subset of the 12 fidelity prompts (default: all)")
    p.add_argument("--kl-k", type=int, default=DEFAULT_KL_K,
                   help="reference top-k ids the KL covers, plus a tail bucket (default %(default)s, "
                        "as `vllm-edge fidelity`)")
    add_threads(p, help="llama.cpp threads")
    add_out(p)


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.bench.llamacpp import fidelity as llamacpp_fidelity
    from vllm_edge.bench.llamacpp import verify as gguf_verify
    from vllm_edge.cli.args import reported

    if not llamacpp_runner.available():
        raise EdgeError(llamacpp_runner.SKIP_REASON)
    for f in (args.ref, args.cand):
        if not Path(f).is_file():
            raise EdgeError(f"{f}: no such GGUF file")
    cfg = gguf_verify.VerifyConfig(greedy_tokens=args.greedy_tokens, chunks=args.chunks,
                                   chunk_len=args.chunk_len, threads=args.threads,
                                   prompt_ids=tuple(args.prompt_ids.split(",")) if args.prompt_ids else None)
    with reported(ValueError):  # e.g. an unknown prompt id, refused before any model loads
        report = llamacpp_fidelity.run(args.ref, args.cand, args.tokenizer, cfg, kl_k=args.kl_k)
    if args.out:
        from vllm_edge.common import atomic, provenance

        report["provenance"] = provenance.collect(model=Path(args.cand), threads=args.threads)
        atomic.write_result(args.out, report)
    print(json.dumps(llamacpp_fidelity.metric_line(report)), flush=True)
    return 0
