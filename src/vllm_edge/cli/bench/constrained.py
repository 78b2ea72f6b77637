"""`vllm-edge bench constrained`: grammar compile and cache on `serve`, and proof it ran."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_edge.cli.args import (
    add_llamacpp_engine,
    add_out,
    add_weight_quant,
    check_llamacpp_engine,
    weight_dtype,
)

NAME = "constrained"
HELP = "cost of a decoding constraint on `serve`: grammar compile (new schema) vs cache vs none"
DESCRIPTION = ("Starts `vllm-edge serve MODEL` on a free loopback port (or uses --base-url with "
               "--server-pid), then for each mode (json_schema: response_format over the agent's "
               "actions; tool_required: tool_choice=required over the agent's tools) sends "
               "--schemas fresh schemas, each once cold, --repeats times warm and once without a "
               "constraint, one request at a time. Records time to first token, the server's queue "
               "time per request (vLLM's histogram: the grammar wait), whether each answer satisfies "
               "the constraint, and which structured-output backend compiled the json_schema grammars "
               "(the server's backend setting and vLLM's own xgrammar check on each schema). "
               "With --engine llamacpp the same requests run on --gguf in this process, each "
               "constraint a GBNF grammar, and the wait is the grammar build (conversion and "
               "llama.cpp's parse). "
               "Exit 1 when a constrained answer is invalid or the backend is not xgrammar.")


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench import constrained

    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--schemas", type=int, default=4, help="fresh schemas per mode (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="warm requests per schema (default %(default)s)")
    p.add_argument("--modes", default="json_schema,tool_required", help="comma list (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=constrained.MAX_TOKENS,
                   help="per request (default %(default)s)")
    p.add_argument("--enforce-eager", action="store_true", help="start the server without torch.compile")
    add_weight_quant(p)
    p.add_argument("--base-url", default=None, help="a running server (loopback only)")
    p.add_argument("--server-log", default=None,
                   help="its log, to read its structured-output backend setting")
    add_llamacpp_engine(p, "a server (started here, or --base-url)")
    p.add_argument("--label", default="", help="free text stored in the artifact")
    add_out(p, default="benchmarks/results/constrained/constrained.json")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench import constrained

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in constrained.MODES]
    if bad:
        raise constrained.ConstrainedBenchError(f"unknown mode {bad[0]!r}; one of {', '.join(constrained.MODES)}")
    try:
        check_llamacpp_engine(args, "--base-url", bool(args.base_url))
    except ValueError as exc:
        raise constrained.ConstrainedBenchError(str(exc)) from None
    if args.engine == "llamacpp":
        result = constrained.run_llamacpp(args.gguf, chat_template=args.chat_template, n_threads=args.threads,
                                          out=args.out, label=args.label or Path(args.gguf).name,
                                          schemas=args.schemas, repeats=args.repeats, modes=modes,
                                          max_tokens=args.max_tokens)
        return _report(args, result, "grammar_s")
    serve_args = ["--quant", args.quant] + (["--enforce-eager"] if args.enforce_eager else [])
    result = constrained.run(args.model, serve_args=serve_args, base_url=args.base_url,
                             server_log=args.server_log, out=args.out,
                             label=args.label or weight_dtype(args.quant), schemas=args.schemas,
                             repeats=args.repeats, modes=modes, max_tokens=args.max_tokens)
    return _report(args, result, "queue_s")


def _report(args: argparse.Namespace, result: dict, wait: str) -> int:
    for mode, s in result["summary"].items():
        print(json.dumps({"mode": mode, **{k: s[k] for k in ("compile_s_estimate", "first_s_estimate",
                                                             "constrained_valid_rate", "free_valid_rate")},
                          **{f"{k}_{wait}_median": s[k][f"{wait}_median"] for k in ("first", "cold", "warm", "free")},
                          **{f"{k}_ttft_s_median": s[k]["ttft_s_median"] for k in ("first", "cold", "warm", "free")}}))
    so = result["structured_outputs"]
    print(f"structured-output backend: setting {so['setting']}, json_schema grammars by {so['json_schema_backend']}")
    if args.out:
        print(f"wrote {args.out}")
    ok = all(s["constrained_valid_rate"] in (None, 1.0) for s in result["summary"].values())
    return 0 if ok and so["json_schema_backend"] in (None, "xgrammar", "llama.cpp GBNF") else 1
