"""`vllm-edge models export-gguf` and the `--verify` flag of `models import-gguf`."""

from __future__ import annotations

import argparse
import json
import sys


def add_verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", action="store_true",
                   help="check the import against llama.cpp on the same GGUF (needs llama-cpp-python)")
    p.add_argument("--verify-out", default=None, metavar="JSON", help="write the full parity report here")


def run_verify(gguf: str, model_dir, out: str | None) -> int:
    """0 passed (or llama.cpp absent, said loudly), 1 parity failed."""
    from vllm_edge.bench.llamacpp import runner as llamacpp_runner
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


def _cmd_export(args: argparse.Namespace) -> int:
    from vllm_edge.models.gguf_export import GgufExportError, export_all, parse_quants

    try:
        paths = export_all(args.src, args.out, out_type=args.type, quants=parse_quants(args.quantize),
                           tokenizer_pre=args.tokenizer_pre, threads=args.threads, force=args.force)
    except GgufExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def add_export_command(msub: "argparse._SubParsersAction") -> None:
    e = msub.add_parser("export-gguf", help="write a GGUF (BF16/F16) from a bf16 safetensors Llama directory",
                        description="Writes OUT with the gguf library, then each --quantize type with "
                                    "llama.cpp's own quantizer as OUT-stem.TYPE.gguf.")
    e.add_argument("src", metavar="SRC_DIR")
    e.add_argument("out", metavar="OUT.gguf")
    e.add_argument("--type", choices=("bf16", "f16"), default="bf16", help="matrix weight type (default bf16)")
    e.add_argument("--quantize", default=None, metavar="Q4_K_M,Q4_0,Q8_0",
                   help="also quantize with llama.cpp (needs llama-cpp-python)")
    e.add_argument("--tokenizer-pre", default=None, metavar="NAME",
                   help="llama.cpp pre-tokenizer name, when it cannot be recognised from tokenizer.json")
    e.add_argument("--threads", type=int, default=None, help="quantization threads (default: allowed cores)")
    e.add_argument("--force", action="store_true",
                   help="replace OUT (and its quantized siblings) even if vllm-edge did not write them")
    e.set_defaults(func=_cmd_export)
