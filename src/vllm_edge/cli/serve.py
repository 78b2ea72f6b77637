"""`vllm-edge serve`: vLLM's OpenAI-compatible server with the edge defaults."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import (MODEL_HELP, add_parallel, add_speculative, add_weight_quant, reported,
                                weight_dtype)

NAME = "serve"
HELP = "vLLM's OpenAI-compatible server with the edge defaults"
DESCRIPTION = ("vLLM's own OpenAI-compatible server (/v1/chat/completions, /v1/completions, "
               "/v1/models, /health, /metrics) with the edge defaults. Arguments after `--` "
               "go to vLLM's serve parser unchanged and win over ours.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="default", help=MODEL_HELP)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="requests under /v1 must send 'Authorization: Bearer KEY' (default: "
                        "VLLM_API_KEY, else none); checked before anything else")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=4,
                   help="sequences decoded together; the KV budget is priced for all of them")
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")
    add_speculative(p)
    add_weight_quant(p)
    p.add_argument("--priority", choices=("speed", "fidelity"), default="speed")
    p.add_argument("--multiprocess", action="store_true",
                   help="vLLM's own layout: a separate worker process beside the engine core")
    p.add_argument("--tool-call-parser", default=None,
                   help="vLLM tool-call parser name, or 'none' (default: chosen from the chat template)")
    p.add_argument("--chat-template", default=None, help="Jinja chat template file")
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds without a request (the keep-alive server "
                        "`run` starts); default: never")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="names requests may use (default: the embedded key and 'default', or MODEL)")
    add_parallel(p)
    nodes = p.add_argument_group("several machines (docs/guide/parallel.md)")
    nodes.add_argument("--nnodes", type=int, default=1, help="machines sharing the ranks")
    nodes.add_argument("--node-rank", type=int, default=0,
                       help="this machine's index; node 0 serves the API, the others only run ranks")
    nodes.add_argument("--master-addr", default=None, help="address of node 0 that every node can reach")
    nodes.add_argument("--master-port", type=int, default=None,
                       help="port of node 0 for the ranks to meet (default: vLLM's)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.serving import serve

    with reported(ValueError):
        parallel = serve.Parallel(args.tensor_parallel_size, args.pipeline_parallel_size, args.nnodes,
                                  args.node_rank, args.master_addr, args.master_port)
        return serve.main(
            args.model, host=args.host, port=args.port, max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs, enforce_eager=args.enforce_eager,
            dtype=weight_dtype(args.quant), priority=args.priority, multiprocess=args.multiprocess,
            tool_call_parser=args.tool_call_parser, chat_template=args.chat_template,
            served_model_name=args.served_model_name, api_key=args.api_key, idle_exit_s=args.idle_exit, extra=getattr(args, "vllm_extra", []),
            parallel=parallel, speculative=args.speculative)
