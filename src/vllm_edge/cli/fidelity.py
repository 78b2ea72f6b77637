"""`vllm-edge fidelity`: greedy divergence and teacher-forced KL against a saved reference."""

from __future__ import annotations

import argparse
import json
import sys

from vllm_edge.cli.args import add_group, add_model, add_out, add_quant, add_torch_dtype, reported
from vllm_edge.common.errors import UsageError

NAME = "fidelity"
HELP = "greedy divergence and teacher-forced KL against a saved bf16 reference"
DESCRIPTION = ("First save a reference from the bf16 build (--save-ref DIR), then score "
               "another build of the same model against it (--ref DIR).")


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench.fidelity import defaults

    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save-ref", metavar="DIR", help="collect this build's outputs as the reference")
    mode.add_argument("--ref", metavar="DIR", help="score this build against the reference in DIR")
    add_model(p)
    add_out(p, help="write the result JSON with provenance here")
    p.add_argument("--corpus-chunks", type=int, default=defaults.DEFAULT_CORPUS_CHUNKS,
                   help="pydoc corpus chunks for the teacher-forced part (default %(default)s; "
                        "with --ref the reference decides)")
    p.add_argument("--chunk-len", type=int, default=defaults.DEFAULT_CHUNK, help="tokens per chunk")
    p.add_argument("--greedy-tokens", type=int, default=defaults.DEFAULT_GREEDY_TOKENS,
                   help="greedy tokens per prompt (with --ref the reference decides)")
    p.add_argument("--prompts", metavar="ID[,ID...]", default=None,
                   help="with --save-ref: the fidelity prompts to keep, by id (default: all 12; "
                        "with --ref the reference decides)")
    p.add_argument("--kl-k", type=int, default=defaults.DEFAULT_KL_K,
                   help="reference top-k ids the KL covers, plus a tail bucket (default %(default)s)")
    add_torch_dtype(p)
    add_quant(p, help="score the embedded model's quantized build (made once and cached, as `run` does)")
    add_group(p, help="group size for --quant")
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    p.add_argument("--engine", choices=("vllm", "llama.cpp"), default="vllm",
                   help="llama.cpp: run --model (a GGUF file) in llama.cpp instead, on the same token "
                        "ids, to save it as a reference or score it (needs [baselines]; 'default' is "
                        "the embedded model's own GGUF)")
    p.add_argument("--dequantized", action="store_true",
                   help="with --engine llama.cpp: run an F32 copy of the file, every tensor dequantized "
                        "(the file's exact weights, without llama.cpp's quantized arithmetic); made in "
                        "a temporary directory and removed after")
    p.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="with --engine llama.cpp: the model directory whose tokenizer and chat template "
                        "make the token ids")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench.fidelity.run import format_metrics, metric_line
    from vllm_edge.bench.fidelity.run import run as fidelity_run

    prompts = tuple(p for p in args.prompts.split(",") if p) if args.prompts is not None else None
    if args.engine == "llama.cpp":
        from vllm_edge.bench.llamacpp.fidelity import against_reference

        if args.quant or args.dtype != "bfloat16" or args.enforce_eager:
            raise UsageError("--quant, --dtype and --enforce-eager apply to vLLM; llama.cpp runs the "
                             "GGUF as stored")
        from vllm_edge.models import store

        gguf, tokenizer = args.model, args.tokenizer
        if gguf == "default" or gguf in store.MODELS:  # the file the embedded model ships as
            gguf = store.source_gguf(store.resolve_key(args.model))
            tokenizer = tokenizer or store.prepare(args.model)
        with reported(ValueError, FileNotFoundError, OSError):
            result = against_reference(gguf, save_ref=args.save_ref, ref=args.ref, out=args.out,
                                       tokenizer=tokenizer, corpus_chunks=args.corpus_chunks,
                                       chunk_len=args.chunk_len, greedy_tokens=args.greedy_tokens,
                                       kl_k=args.kl_k, prompts=prompts, dequantized=args.dequantized)
    else:
        if args.dequantized:
            raise UsageError("--dequantized runs llama.cpp on an F32 copy of a GGUF file: give --engine llama.cpp")
        with reported(ValueError, FileNotFoundError):
            result = fidelity_run(args.model, save_ref=args.save_ref, ref=args.ref, out=args.out,
                                  corpus_chunks=args.corpus_chunks, chunk_len=args.chunk_len,
                                  greedy_tokens=args.greedy_tokens, kl_k=args.kl_k, dtype=args.dtype,
                                  enforce_eager=args.enforce_eager, quant=args.quant, group=args.group,
                                  prompts=prompts)
    if result["benchmark"] == "fidelity-reference":
        print(f"[fidelity] saved reference {result['reference']}: {result['prompts']} prompts, "
              f"{result['chunks']} corpus chunks, top-{result['k']}", file=sys.stderr)
        print(json.dumps({"benchmark": "fidelity-reference", "reference": result["reference"]}))
        return 0
    print(format_metrics(result), file=sys.stderr)
    if args.out:
        print(f"[fidelity] wrote {args.out}", file=sys.stderr)
    print(json.dumps(metric_line(result)), flush=True)
    return 0
