"""`vllm-edge bench npu`: the NPU export's fidelity, HTP placement and context binary."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out

NAME = "npu"
HELP = "export w8a16/w8a8/float NPU graphs, compile for the QNN HTP, score against the bf16 model"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="'default' or a bf16 Llama folder")
    p.add_argument("--context", type=int, default=128, help="fixed context (default 128)")
    p.add_argument("--prefill", type=int, default=32, help="prefill chunk (default 32)")
    p.add_argument("--calibration-prompts", type=int, default=None, metavar="N",
                   help="calibrate on the first N shipped prompts (default all)")
    p.add_argument("--htp-budget", type=float, default=900.0, metavar="S",
                   help="score on the HTP emulation when all prompts fit in S seconds (default 900)")
    from vllm_edge.models.npu.sink import MODES

    p.add_argument("--sink", choices=MODES, default="auto",
                   help="export with the attention sink when the model has one (auto, default; a "
                        "w8a16 export without it is scored beside) or without (off)")
    p.add_argument("--keep", default=None, metavar="DIR", help="keep the w8a16 build and its qnn/ binaries")
    add_out(p, help="write the result JSON with provenance here (default "
                    "benchmarks/results/npu/<this host>.json)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import npu

    r = npu.run(args.model, context=args.context, prefill=args.prefill,
                calibration_limit=args.calibration_prompts, htp_budget=args.htp_budget, out=args.out,
                keep=args.keep, sink=args.sink)
    print(json.dumps({k: r[k] for k in ("top1", "kl", "bounds", "without_sink", "ran_on", "nodes_on_htp_fraction",
                                         "context_binary", "passes")}, indent=2))
    return 0
