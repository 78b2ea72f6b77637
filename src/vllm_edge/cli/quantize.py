"""`vllm-edge quantize SRC DST --quant cpu_int4|gptq --group 32|64|128`."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import QUANT_SCHEMES, add_group, add_quant, reported
from vllm_edge.quant import formats
from vllm_edge.quant.groups import DEFAULT_GROUP

NAME = "quantize"
HELP = "write a 4-bit CPU checkpoint (cpu_int4, or gptq for vLLM's W4A8/AMX path)"
_BITS = {32: "5.0", 64: "4.5", 128: "4.25"}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="source safetensors model directory (bf16/fp16/fp32)")
    p.add_argument("dst", help="output directory (written atomically)")
    add_quant(p, choices=QUANT_SCHEMES, default=formats.DEFAULT,
              help="; ".join(f"{f.name}{' (default)' if f.name == formats.DEFAULT else ''}: {f.summary}"
                             for f in formats.all_formats()))
    sizes = ", ".join(f"{g} = {b}" + (" (default)" if g == DEFAULT_GROUP else "")
                      for g, b in _BITS.items())
    add_group(p, help=f"input columns per scale, bits/weight: {sizes}; 32 matches a Q4_1 "
                      "source's blocks; see docs/guide/quantize.md")
    p.add_argument("--keep-embedding", action="store_true",
                   help="keep the input embedding in its source dtype (gptq always does)")
    p.add_argument("--quantize-vision", action=argparse.BooleanOptionalAction, default=None,
                   help="vision-language models: quantize the vision tower's linears too "
                        "(default: no; the connector always stays bf16)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="replace DST even if it is not a quantizer output (never the source)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.quant.quantize import REPORT_NAME, quantize_model

    with reported(ValueError, FileNotFoundError):
        dst = quantize_model(args.src, args.dst, scheme=args.quant, group=args.group,
                             quantize_embedding=not args.keep_embedding,
                             quantize_vision=args.quantize_vision, progress=not args.no_progress,
                             force=args.force)
    report = json.loads((dst / REPORT_NAME).read_text())
    summary = {k: v for k, v in report.items() if k not in ("tensors", "kept_bf16")}
    # the bf16 layers, grouped by reason (a VLM keeps its connector and maybe its tower)
    by_reason: dict[str, int] = {}
    for k in report.get("kept_bf16", []):
        by_reason[k["reason"]] = by_reason.get(k["reason"], 0) + 1
    summary["kept_bf16_by_reason"] = by_reason
    print(json.dumps(summary, indent=2))
    return 0
