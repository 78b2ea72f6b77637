"""`vllm-edge models import-gguf FILE OUT [--verify] [--repack [--no-requantize] [--keep-embedding]]`."""

from __future__ import annotations

import argparse
import json
import sys

from vllm_edge.common.errors import UsageError

NAME = "import-gguf"
HELP = "convert a GGUF file into a bf16 safetensors directory, or repack it into cpu_int4"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("out")
    p.add_argument("--force", action="store_true", help="convert again even if OUT is up to date, and replace OUT even if it "
                   "is not a conversion vllm-edge made")
    p.add_argument("--verify", action="store_true",
                   help="check the import against llama.cpp on the same GGUF (needs llama-cpp-python)")
    p.add_argument("--verify-out", default=None, metavar="JSON", help="write the full parity report here")
    p.add_argument("--repack", action="store_true",
                   help="write a cpu_int4 g32 checkpoint instead: Q4_0, Q4_1 and Q4_K tensors keep their "
                        "4-bit codes (only scales and offsets are rounded to bf16); docs/guide/quantize.md")
    p.add_argument("--no-requantize", dest="requantize", action="store_false",
                   help="with --repack: tensors in formats that do not map onto 4-bit codes (Q8_0, Q6_K, "
                        "Q5_0, F16, ...) stay bf16, with their fused siblings, instead of being quantized "
                        "again at g32")
    p.add_argument("--keep-embedding", action="store_true",
                   help="with --repack: the token embedding stays bf16 (a head tied to it reads the same "
                        "bf16 table)")


def run(args: argparse.Namespace) -> int:
    if not args.repack and (not args.requantize or args.keep_embedding):
        raise UsageError("--no-requantize and --keep-embedding apply to --repack only")
    if args.repack:
        if args.verify:
            raise UsageError("--verify checks a bf16 import with transformers, which cannot load a "
                             "cpu_int4 checkpoint; measure a repack with `vllm-edge fidelity`")
        from vllm_edge.models.gguf_repack import repack_gguf

        print(repack_gguf(args.file, args.out, requantize=args.requantize,
                          keep_embedding=args.keep_embedding, force=args.force))
        return 0
    from vllm_edge.models.gguf_import import import_gguf

    path = import_gguf(args.file, args.out, force=args.force)
    print(path)
    if args.verify:
        return run_verify(args.file, path, args.verify_out)
    return 0


def run_verify(gguf: str, model_dir, out: str | None) -> int:
    """0 passed (or llama.cpp absent, said loudly), 1 parity failed."""
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.bench.llamacpp import verify as gguf_verify
    from vllm_edge.common import atomic, provenance

    if not llamacpp_runner.available():
        print(f"verify: NOT run: {llamacpp_runner.SKIP_REASON}. The import is unverified.", file=sys.stderr)
        return 0
    report = gguf_verify.verify(gguf, model_dir)
    print(gguf_verify.summary(report), file=sys.stderr)
    if out:
        report["provenance"] = provenance.collect(model=model_dir)
        atomic.write_json(out, report)
        print(f"verify: wrote {out}", file=sys.stderr)
    print(json.dumps({k: report[k] for k in ("passed", "criterion", "quantized_source")}))
    return 0 if report["passed"] else 1
