"""`vllm-edge bench toolcalls`: the named/required tool-call contract under load."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_out, add_weight_quant, weight_dtype

NAME = "toolcalls"
HELP = "many named/required/auto tool calls against `serve`: violations of the contract per cell"
DESCRIPTION = ("Starts `vllm-edge serve MODEL` on a free loopback port (or uses --base-url), "
               "then for each cell (TEMPERATURE:stream|nonstream) sends --calls named+required "
               "tool calls from --clients clients, with the soak's abandoned streams and "
               "over-long prompts in between. A call must come back valid (the right tool, "
               "arguments that satisfy its schema) or with finish_reason=length. Exit 1 on "
               "any violation. Set VLLM_EDGE_PATCH_HERMES_JSON_END=0 for the unpatched server.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--cells", default="0:nonstream,0:stream,1:nonstream,1:stream",
                   help="comma-separated TEMPERATURE:stream|nonstream (default: %(default)s)")
    p.add_argument("--calls", type=int, default=2000,
                   help="named+required calls per cell (default %(default)s)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-seconds-per-cell", type=float, default=3600)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--enforce-eager", action="store_true", help="start the server without torch.compile")
    add_weight_quant(p)
    p.add_argument("--base-url", default=None, help="a running server (loopback only)")
    p.add_argument("--label", default="", help="free text stored in the artifact")
    p.add_argument("--seed", type=int, default=0)
    add_out(p, default="benchmarks/results/toolcalls/toolcalls.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import toolcalls

    cells = toolcalls.parse_cells(args.cells)
    serve_args = ["--quant", args.quant] + (["--enforce-eager"] if args.enforce_eager else [])
    result = toolcalls.run(args.model, cells=cells, calls=args.calls, clients=args.clients,
                           max_seconds_per_cell=args.max_seconds_per_cell,
                           max_tokens=args.max_tokens, serve_args=serve_args,
                           base_url=args.base_url, out=args.out, seed=args.seed,
                           label=args.label or weight_dtype(args.quant))
    for c in result["cells"]:
        print(json.dumps({k: c[k] for k in ("temperature", "stream", "wall_s", "constrained_calls",
                                            "unanswered", "violations")}))
    return 0 if result["violations_total"] == 0 else 1
