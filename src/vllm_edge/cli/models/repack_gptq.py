"""`vllm-edge models repack-gptq SRC DST [--force]`."""

from __future__ import annotations

import argparse
import json

NAME = "repack-gptq"
HELP = "repack a 4-bit GPTQ (or AutoAWQ GEMM) checkpoint into cpu_int4, keeping its codes"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="GPTQ model directory (4-bit, desc_act false; e.g. from "
                               "`vllm-edge quantize --quant gptq`) or AutoAWQ GEMM directory")
    p.add_argument("dst", help="output directory (written atomically)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="replace DST even if it is not a GPTQ repack vllm-edge made (never the source)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models.gptq_repack import REPORT_NAME, repack_gptq

    out = repack_gptq(args.src, args.dst, force=args.force, progress=not args.no_progress)
    report = json.loads((out / REPORT_NAME).read_text())
    print(json.dumps({"out": str(out), **{k: v for k, v in report.items() if k != "tensors"}}, indent=2))
    return 0
