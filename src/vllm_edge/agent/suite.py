"""Run tasks x variants x repeats, summarise pass rates, and write the result with provenance."""

from __future__ import annotations

import os
import time
from typing import Callable

from vllm_edge.agent.loop import ChatFn, run_agent
from vllm_edge.agent.tasks import Outcome, Task

MIN_RUNS_PER_TASK = 3  # below this a pass rate says little


def run_one(task: Task, variant: str, chat: ChatFn, max_steps: int = 20, run: int = 1) -> Outcome:
    device = task.make_device(variant)
    trace = run_agent(device, task.goal, chat, max_steps=max_steps)
    return task.evaluate(device, trace, variant=variant, run=run)


def format_run(o: Outcome) -> str:
    head = f"{'PASS' if o.success else 'fail'} {o.task}/{o.variant} #{o.run}"
    stats = f"{o.steps} steps, {o.noop_actions} no-op, {o.self_undos} self-undo, {o.recoveries} recovered"
    return f"{head} ({stats})" + ("" if o.success else f": {o.failure_reason}")


def summarize(outcomes: list[Outcome]) -> dict:
    per_task: dict[str, dict] = {}
    for o in outcomes:
        t = per_task.setdefault(o.task, {"runs": 0, "passed": 0, "failed_variants": [], "falsely_claimed_done": 0,
                                         "goal_reached": 0, "collateral_runs": 0, "errors": 0})
        t["runs"] += 1
        t["passed"] += o.success
        t["goal_reached"] += o.goal_reached
        t["collateral_runs"] += bool(o.collateral)
        t["falsely_claimed_done"] += o.falsely_claimed_done
        t["errors"] += o.error is not None
        if not o.success and o.variant not in t["failed_variants"]:
            t["failed_variants"].append(o.variant)
    for t in per_task.values():
        t["pass_rate"] = t["passed"] / t["runs"]
    n = len(outcomes)
    warnings = [f"{name}: only {t['runs']} run(s); fewer than {MIN_RUNS_PER_TASK} runs per task make the pass "
                f"rate noise (add variants or --repeat)" for name, t in per_task.items()
                if t["runs"] < MIN_RUNS_PER_TASK]
    return {
        "runs": n,
        "passed": sum(o.success for o in outcomes),
        "pass_rate": (sum(o.success for o in outcomes) / n) if n else None,
        "falsely_claimed_done": sum(o.falsely_claimed_done for o in outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        "noop_actions": sum(o.noop_actions for o in outcomes),
        "self_undos": sum(o.self_undos for o in outcomes),
        "recoveries": sum(o.recoveries for o in outcomes),
        "mean_steps": (sum(o.steps for o in outcomes) / n) if n else None,
        "per_task": per_task,
        "warnings": warnings,
    }


def format_summary(summary: dict) -> list[str]:
    lines = []
    for name, t in summary["per_task"].items():
        line = f"{name}: {t['passed']}/{t['runs']} passed ({100 * t['pass_rate']:.0f}%)"
        if t["failed_variants"]:
            line += "; failed variants: " + ", ".join(t["failed_variants"])
        lines.append(line)
    if summary["runs"]:
        lines.append(f"overall: {summary['passed']}/{summary['runs']} passed ({100 * summary['pass_rate']:.0f}%); "
                     f"falsely claimed done: {summary['falsely_claimed_done']}; "
                     f"no-op actions: {summary['noop_actions']}; self-undos: {summary['self_undos']}; "
                     f"recovered calls: {summary['recoveries']}")
    if summary["errors"]:
        lines.append(f"errors (chat or device, not model failures): {summary['errors']} run(s)")
    lines += [f"warning: {w}" for w in summary["warnings"]]
    return lines


def run_suite(
    chat: ChatFn,
    tasks: list[Task],
    variants: list[str],
    repeat: int = 1,
    max_steps: int = 20,
    log: Callable[[str], None] | None = print,
) -> dict:
    """All runs plus the summary; ``log`` receives one PASS/fail line per run as it finishes."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    outcomes = []
    t0 = time.monotonic()
    for task in tasks:
        for variant in variants:
            for r in range(1, repeat + 1):
                o = run_one(task, variant, chat, max_steps=max_steps, run=r)
                outcomes.append(o)
                if log:
                    log(format_run(o))
    return {
        "summary": summarize(outcomes),
        "runs": [o.to_dict() for o in outcomes],
        "wall_s": round(time.monotonic() - t0, 3),
        "config": {"tasks": [t.name for t in tasks], "variants": list(variants), "repeat": repeat,
                   "max_steps": max_steps},
    }


def write_report(path: str | os.PathLike, report: dict, extra_provenance: dict | None = None) -> None:
    """Atomically write the report with provenance (host, versions, build, env)."""
    from vllm_edge.common.atomic import write_json
    from vllm_edge.common.provenance import collect

    write_json(path, {"kind": "agent_suite", "provenance": collect(extra=extra_provenance), **report})
