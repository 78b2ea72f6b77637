"""`vllm-edge run`: load a model and answer one chat prompt."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_model, add_output, add_weight_quant, reported, weight_dtype

NAME = "run"
HELP = "load a model and answer one chat prompt"


def add_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--prompt", default=None, help="user message (default: the capital of France)")
    p.add_argument("--system", default=None, help="system message ('' for none)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    p.add_argument("--multiprocess", action="store_true",
                   help="vLLM's default engine-core and worker processes instead of one process")
    add_output(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show vLLM's own output live instead of keeping it in "
                        "$VLLM_EDGE_HOME/logs/run-*.log (-o json always shows it)")
    add_weight_quant(p)
    p.add_argument("--priority", choices=("speed", "fidelity"), default="speed",
                   help="what the weight-path choice favours (see docs/guide/quantize.md)")
    p.add_argument("--image", action="append", default=None, metavar="PATH",
                   help="an image file (or a data:image/...;base64 URL) to put before the prompt; "
                        "repeat for several. With --model default, runs the embedded VLM "
                        "smolvlm-135m (docs/guide/multimodal.md)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.serving import run as chat

    as_json = args.output == "json"
    with reported(ValueError):
        result = chat.run(
            model=args.model, prompt=chat.DEFAULT_PROMPT if args.prompt is None else args.prompt,
            system=(chat.DEFAULT_SYSTEM if args.system is None else args.system) or None,
            max_tokens=args.max_tokens, max_model_len=args.max_model_len,
            enforce_eager=args.enforce_eager, one_process=not args.multiprocess, as_json=as_json,
            dtype=weight_dtype(args.quant), priority=args.priority, images=args.image,
            verbose=args.verbose or as_json,
        )
    chat.print_result(result, as_json)
    return 0
