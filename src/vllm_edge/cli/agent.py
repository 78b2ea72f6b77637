"""`vllm-edge agent run|list`: the agent suite on a simulated phone, judged by device state."""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
from pathlib import Path

from vllm_edge.cli.args import add_llamacpp_engine, add_out, add_weight_quant, check_llamacpp_engine, reported
from vllm_edge.common.errors import EdgeError

NAME = "agent"
HELP = "agent suite on a simulated phone, judged by device state"
GROUP = True


def run_suite(args: argparse.Namespace) -> int:
    from vllm_edge.agent import prompts
    from vllm_edge.agent.tasks import select_tasks, select_variants

    with reported(ValueError):
        tasks = select_tasks(args.tasks)
        variants = select_variants(args.variants)
        system_prompt = prompts.prompt(args.prompt)
        check_llamacpp_engine(args, "--base-url or --serve", bool(args.base_url or args.serve))
        if args.engine == "llamacpp" and args.n_ctx < 1:
            raise ValueError(f"--n-ctx {args.n_ctx}: must be at least 1")
    if args.engine == "llamacpp":
        return _run_llamacpp(args, tasks, variants, system_prompt)
    with reported(ValueError):
        if (args.base_url is None) == (not args.serve):
            raise ValueError("give --base-url URL (a running server) or --serve (start one), not both")
        if args.base_url and not args.model:
            raise ValueError("--model: the served model name is needed with --base-url")
    if args.serve:
        return _with_server(args, tasks, variants, system_prompt)
    return _run(args, args.base_url, tasks, variants, system_prompt, server_log=None)


def _run(args, base_url, tasks, variants, system_prompt, server_log: str | None) -> int:
    from vllm_edge.agent import suite
    from vllm_edge.agent.client import openai_chat

    tool_choice = "required" if args.constrained else "auto"
    chat = openai_chat(base_url, args.model, api_key=args.api_key, temperature=args.temperature,
                       max_tokens=args.max_tokens, seed=args.seed, tool_choice=tool_choice)
    report = suite.run_suite(chat, tasks, variants, repeat=args.repeat, max_steps=args.max_steps,
                             system_prompt=system_prompt)
    for line in suite.format_summary(report["summary"]):
        print(line)
    report["config"].update(base_url=base_url, model=args.model, temperature=args.temperature,
                            max_tokens=args.max_tokens, seed=args.seed, constrained=args.constrained,
                            tool_choice=tool_choice, prompt=args.prompt, engine="vllm",
                            serve_args=getattr(args, "serve_args", None), server_log=server_log)
    if args.out:
        suite.write_report(args.out, report, extra_provenance={"served_model": args.model, "base_url": base_url,
                                                               "server_model": _served(args, base_url)})
        print(f"wrote {args.out}")
    return 1 if report["summary"]["errors"] else 0


def _run_llamacpp(args, tasks, variants, system_prompt) -> int:
    """The same suite on llama.cpp in this process (llama-cpp-python): the GGUF loaded once,
    prompted with the template serve would give vLLM and constrained the way vLLM is."""
    from vllm_edge.agent import suite
    from vllm_edge.bench.engines.llamacpp_chat import llamacpp_chat

    tool_choice = "required" if args.constrained else "auto"
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise EdgeError("--engine llamacpp needs llama-cpp-python "
                        "(pip install 'vllm-edge[baselines]')") from None
    with reported(ValueError, OSError):
        chat = llamacpp_chat(args.gguf, temperature=args.temperature, max_tokens=args.max_tokens,
                             seed=args.seed, tool_choice=tool_choice, n_ctx=args.n_ctx,
                             n_threads=args.threads, chat_template=args.chat_template)
    try:
        report = suite.run_suite(chat, tasks, variants, repeat=args.repeat, max_steps=args.max_steps,
                                 system_prompt=system_prompt)
        info = chat.describe()
    finally:
        chat.close()
    for line in suite.format_summary(report["summary"]):
        print(line)
    report["config"].update(model=str(args.gguf), temperature=args.temperature, max_tokens=args.max_tokens,
                            seed=args.seed, constrained=args.constrained, prompt=args.prompt, **info)
    if args.out:
        suite.write_report(args.out, report,
                           extra_provenance={"gguf": info["gguf"], "gguf_sha256": info["gguf_sha256"]})
        print(f"wrote {args.out}")
    return 1 if report["summary"]["errors"] else 0


def _with_server(args, tasks, variants, system_prompt) -> int:
    """Start `vllm-edge serve` on a free loopback port for this run; its log, gzipped, lands
    beside --out (the artifact names it), so the result carries what the server said."""
    from vllm_edge.bench import soak

    out = Path(args.out) if args.out else Path("agent_suite.json")
    log = out.with_name(out.stem + ".server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    args.serve_args = ["default", "--quant", args.quant] + (["--enforce-eager"] if args.enforce_eager else [])
    port = soak.free_port()
    proc = soak.start_server(args.serve_args, port, log)
    try:
        args.model = args.model or "default"
        return _run(args, f"http://127.0.0.1:{port}/v1", tasks, variants, system_prompt,
                    server_log=log.name + ".gz")
    finally:
        soak.stop_server(proc)
        with open(log, "rb") as src, gzip.open(f"{log}.gz.partial", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(f"{log}.gz.partial", f"{log}.gz")  # atomic: a half-written log never shows
        log.unlink()


def _served(args: argparse.Namespace, base_url: str) -> dict | None:
    """What the server says it runs under that name (vLLM: the weights directory as `root`), so
    a result names its build even when every build is served as 'default'."""
    from openai import OpenAI

    try:
        models = OpenAI(base_url=base_url, api_key=args.api_key, max_retries=0, timeout=10).models.list()
    except Exception as exc:  # the runs are already done; a missing listing only costs provenance
        return {"error": f"{type(exc).__name__}: {exc}"}
    for m in models.data:
        if m.id == args.model:
            extra = m.model_extra or {}
            return {"id": m.id, "root": extra.get("root"), "max_model_len": extra.get("max_model_len")}
    return None


def list_tasks(args: argparse.Namespace) -> int:
    from vllm_edge.agent.device import VARIANTS
    from vllm_edge.agent.prompts import PROMPTS
    from vllm_edge.agent.tasks import TASKS

    for t in TASKS.values():
        print(f"{t.name}: {t.goal}")
    print("variants: " + ", ".join(VARIANTS))
    print("prompts: " + ", ".join(PROMPTS))
    return 0


def add_args(p: argparse.ArgumentParser) -> None:
    asub = p.add_subparsers(dest="agent_command", required=True)
    r = asub.add_parser("run", help="run tasks x variants x repeats against an OpenAI-compatible server, "
                                    "or on llama.cpp in this process")
    add_llamacpp_engine(r, "a server (--base-url or --serve)")
    r.add_argument("--n-ctx", type=int, default=2048,
                   help="with --engine llamacpp: context tokens (default %(default)s, serve's max_model_len)")
    r.add_argument("--base-url", default=None, help="a running server, e.g. http://127.0.0.1:8000/v1")
    r.add_argument("--serve", action="store_true",
                   help="start `vllm-edge serve default` on a free loopback port for the run instead; "
                        "its log is gzipped beside --out")
    add_weight_quant(r)
    r.add_argument("--enforce-eager", action="store_true", help="with --serve: no torch.compile")
    r.add_argument("--model", default=None, help="served model name (with --serve: default)")
    r.add_argument("--api-key", default="EMPTY")
    r.add_argument("--tasks", default="all", help="'all' or a comma list (see `vllm-edge agent list`)")
    r.add_argument("--variants", default="all",
                   help="'all' or a comma list of base, renamed, reordered, decoy, deeper ('+' combines)")
    r.add_argument("--repeat", type=int, default=1, help="runs per task and variant")
    r.add_argument("--max-steps", type=int, default=20, help="model turns per run")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--max-tokens", type=int, default=256, help="per model turn")
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--constrained", action="store_true",
                   help="send tool_choice=required: the server constrains every reply to a call of one "
                        "of the offered tools (vLLM: structured outputs through xgrammar; llamacpp: the "
                        "same structure as a GBNF grammar)")
    r.add_argument("--prompt", default="default", help="system prompt: default or example (one worked example)")
    add_out(r, default="benchmarks/results/agent_suite.json", help="JSON result path ('' for none)")
    r.set_defaults(func=run_suite)
    ls = asub.add_parser("list", help="tasks, variants and prompts")
    ls.set_defaults(func=list_tasks)


def run(args: argparse.Namespace) -> int:
    return args.func(args)
