"""`vllm-edge quantize SRC DST --scheme cpu_int4|gptq --group 64|128`."""

from __future__ import annotations

import argparse
import json


def _cmd_quantize(args: argparse.Namespace) -> int:
    from vllm_edge.quant.quantize import REPORT_NAME, quantize_model

    dst = quantize_model(args.src, args.dst, scheme=args.scheme, group=args.group,
                         quantize_embedding=not args.keep_embedding, progress=not args.no_progress)
    report = json.loads((dst / REPORT_NAME).read_text())
    print(json.dumps({k: v for k, v in report.items() if k != "tensors"}, indent=2))
    return 0


def add_quant_commands(subparsers) -> None:
    from vllm_edge.quant.quantize import GROUPS, SCHEMES

    q = subparsers.add_parser("quantize", help="write a 4-bit CPU checkpoint (cpu_int4, or gptq for vLLM's W4A8/AMX path)")
    q.add_argument("src", help="source safetensors model directory (bf16/fp16/fp32)")
    q.add_argument("dst", help="output directory (written atomically)")
    q.add_argument("--scheme", choices=SCHEMES, default="cpu_int4")
    q.add_argument("--group", type=int, choices=GROUPS, default=64,
                   help="input columns per scale (64: SmolLM2-135M keeps its answers; see docs/cpu-4bit.md)")
    q.add_argument("--keep-embedding", action="store_true",
                   help="keep the input embedding in its source dtype (gptq always does)")
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=_cmd_quantize)
