"""`vllm-edge models import-gguf FILE OUT [--verify]`."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "import-gguf"
HELP = "convert a GGUF file into a bf16 safetensors directory"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("out")
    p.add_argument("--force", action="store_true", help="convert again even if OUT is up to date, and replace OUT even if it "
                   "is not a conversion vllm-edge made")
    p.add_argument("--verify", action="store_true",
                   help="check the import against llama.cpp on the same GGUF (needs llama-cpp-python)")
    p.add_argument("--verify-out", default=None, metavar="JSON", help="write the full parity report here")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models.gguf_import import import_gguf

    path = import_gguf(args.file, args.out, force=args.force)
    print(path)
    if args.verify:
        return run_verify(args.file, path, args.verify_out)
    return 0


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
