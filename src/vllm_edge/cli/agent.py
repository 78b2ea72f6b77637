"""`vllm-edge agent run|list`: the agent suite on a simulated phone, judged by device state."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_out, reported

NAME = "agent"
HELP = "agent suite on a simulated phone, judged by device state"
GROUP = True


def run_suite(args: argparse.Namespace) -> int:
    from vllm_edge.agent import suite
    from vllm_edge.agent.client import openai_chat
    from vllm_edge.agent.tasks import select_tasks, select_variants

    with reported(ValueError):
        tasks = select_tasks(args.tasks)
        variants = select_variants(args.variants)
    tool_choice = "required" if args.constrained else "auto"
    chat = openai_chat(args.base_url, args.model, api_key=args.api_key, temperature=args.temperature,
                       max_tokens=args.max_tokens, seed=args.seed, tool_choice=tool_choice)
    report = suite.run_suite(chat, tasks, variants, repeat=args.repeat, max_steps=args.max_steps)
    for line in suite.format_summary(report["summary"]):
        print(line)
    report["config"].update(base_url=args.base_url, model=args.model, temperature=args.temperature,
                            max_tokens=args.max_tokens, seed=args.seed, constrained=args.constrained,
                            tool_choice=tool_choice)
    if args.out:
        suite.write_report(args.out, report, extra_provenance={"served_model": args.model,
                                                               "base_url": args.base_url,
                                                               "server_model": _served(args)})
        print(f"wrote {args.out}")
    return 1 if report["summary"]["errors"] else 0


def _served(args: argparse.Namespace) -> dict | None:
    """What the server says it runs under that name (vLLM: the weights directory as `root`), so
    a result names its build even when every build is served as 'default'."""
    from openai import OpenAI

    try:
        models = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=10).models.list()
    except Exception as exc:  # the runs are already done; a missing listing only costs provenance
        return {"error": f"{type(exc).__name__}: {exc}"}
    for m in models.data:
        if m.id == args.model:
            extra = m.model_extra or {}
            return {"id": m.id, "root": extra.get("root"), "max_model_len": extra.get("max_model_len")}
    return None


def list_tasks(args: argparse.Namespace) -> int:
    from vllm_edge.agent.device import VARIANTS
    from vllm_edge.agent.tasks import TASKS

    for t in TASKS.values():
        print(f"{t.name}: {t.goal}")
    print("variants: " + ", ".join(VARIANTS))
    return 0


def add_args(p: argparse.ArgumentParser) -> None:
    asub = p.add_subparsers(dest="agent_command", required=True)
    r = asub.add_parser("run", help="run tasks x variants x repeats against an OpenAI-compatible server")
    r.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    r.add_argument("--model", required=True, help="served model name")
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
                        "of the offered tools (vLLM: structured outputs through xgrammar)")
    add_out(r, default="benchmarks/results/agent_suite.json", help="JSON result path ('' for none)")
    r.set_defaults(func=run_suite)
    ls = asub.add_parser("list", help="tasks and variants")
    ls.set_defaults(func=list_tasks)


def run(args: argparse.Namespace) -> int:
    return args.func(args)
