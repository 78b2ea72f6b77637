"""`vllm-edge quantize SRC DST --scheme cpu_int4|gptq --group 32|64|128`."""

from __future__ import annotations

import argparse
import json
import sys

from vllm_edge.quant.groups import DEFAULT_GROUP


def _cmd_quantize(args: argparse.Namespace) -> int:
    from vllm_edge.quant.quantize import REPORT_NAME, quantize_model

    try:
        dst = quantize_model(args.src, args.dst, scheme=args.scheme, group=args.group,
                             quantize_embedding=not args.keep_embedding,
                             quantize_vision=args.quantize_vision, progress=not args.no_progress,
                             force=args.force)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = json.loads((dst / REPORT_NAME).read_text())
    summary = {k: v for k, v in report.items() if k not in ("tensors", "kept_bf16")}
    # the bf16 layers, grouped by reason (a VLM keeps its connector and maybe its tower)
    by_reason: dict[str, int] = {}
    for k in report.get("kept_bf16", []):
        by_reason[k["reason"]] = by_reason.get(k["reason"], 0) + 1
    summary["kept_bf16_by_reason"] = by_reason
    print(json.dumps(summary, indent=2))
    return 0


def add_quant_commands(subparsers) -> None:
    from vllm_edge.quant.quantize import GROUPS, SCHEMES

    q = subparsers.add_parser("quantize", help="write a 4-bit CPU checkpoint (cpu_int4, or gptq for vLLM's W4A8/AMX path)")
    q.add_argument("src", help="source safetensors model directory (bf16/fp16/fp32)")
    q.add_argument("dst", help="output directory (written atomically)")
    q.add_argument("--scheme", choices=SCHEMES, default="cpu_int4")
    q.add_argument("--group", type=int, choices=GROUPS, default=DEFAULT_GROUP,
                   help="input columns per scale: 32 = 5.0 bits/weight (matches a Q4_1 source's blocks), "
                        "64 = 4.5 (default), 128 = 4.25; see docs/cpu-4bit.md")
    q.add_argument("--keep-embedding", action="store_true",
                   help="keep the input embedding in its source dtype (gptq always does)")
    q.add_argument("--quantize-vision", action=argparse.BooleanOptionalAction, default=None,
                   help="vision-language models: quantize the vision tower's linears too "
                        "(default: no; the connector always stays bf16)")
    q.add_argument("--no-progress", action="store_true")
    q.add_argument("--force", action="store_true",
                   help="replace DST even if it is not a quantizer output (never the source)")
    q.set_defaults(func=_cmd_quantize)
