"""`vllm-edge models export-npu SRC OUT [--context N] [--prefill N] [--precision w8a16]`."""

from __future__ import annotations

import argparse

NAME = "export-npu"
HELP = "write a fixed-shape QDQ ONNX decoder (prefill + decode graphs, KV cache as I/O) for Qualcomm QNN"
DESCRIPTION = ("From 'default' or a bf16 Llama folder: prefill.onnx and decode.onnx at one fixed context, "
               "the KV cache as explicit inputs and outputs, quantized QDQ (8-bit weights, 16-bit "
               "activations by default) by onnxruntime's QNN configuration, calibrated on a shipped prompt "
               "set; the tokenizer and a manifest beside them. Needs the [npu] extra.")


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.models.npu.export import DEFAULT_CONTEXT, DEFAULT_PREFILL, PRECISIONS, WEIGHT_SCHEMES
    from vllm_edge.models.npu.sink import MODES

    p.add_argument("src", metavar="SRC", help="'default' or a bf16 safetensors Llama folder")
    p.add_argument("out", metavar="OUT", help="the folder to write")
    p.add_argument("--context", default=str(DEFAULT_CONTEXT), metavar="N",
                   help=f"fixed context length, cache slots included (default {DEFAULT_CONTEXT})")
    p.add_argument("--prefill", default=str(DEFAULT_PREFILL), metavar="N",
                   help=f"prefill chunk length (default {DEFAULT_PREFILL}); decode is always 1")
    p.add_argument("--precision", choices=PRECISIONS, default="w8a16",
                   help="w8a16 (the QNN HTP form, default), w8a8, or float (float32, the fidelity bound)")
    p.add_argument("--weights", choices=WEIGHT_SCHEMES, default="per-channel",
                   help="8-bit weight scales: per output channel (default) or one per matrix")
    p.add_argument("--sink", choices=MODES, default="auto",
                   help="auto (default): when every sequence starts with the same token (BOS or the chat "
                        "template's first), ship its position-0 keys and values as sink_kv.npy and keep "
                        "position 0 out of the graphs; off: the graphs run position 0 too")
    p.add_argument("--force", action="store_true", help="replace OUT even if vllm-edge did not write it")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models.npu.export import export_npu

    print(export_npu(args.src, args.out, context=args.context, prefill=args.prefill,
                     precision=args.precision, weights=args.weights, sink=args.sink,
                     force=args.force))
    return 0
