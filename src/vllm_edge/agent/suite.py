"""Run tasks x variants x repeats, summarise pass rates, and write the result with provenance.

Besides the oracle's verdict, every run records its turns as the server answered them: the
time each took and whether the reply was a *valid call* (a ``tool_calls`` entry naming an
offered tool, with JSON arguments that satisfy that tool's parameters schema). That is what
constrained decoding promises, so it is measured apart from whether the action made sense.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_edge.agent.loop import SYSTEM_PROMPT, run_agent
from vllm_edge.agent.tasks import Outcome, Task
from vllm_edge.bench.engines.chat import ChatFn, ContextOverflow
from vllm_edge.common.schema import schema_errors

MIN_RUNS_PER_TASK = 3  # below this a pass rate says little


def judge_call(reply: dict | None, tools: list[dict]) -> str:
    """``valid``, or why the reply's first tool call is not a valid call of an offered tool:
    ``no_tool_call``, ``cut_at_max_tokens`` (the reply ran out of tokens before a call was
    complete), ``unknown_tool``, ``invalid_json``, ``schema_invalid``.

    Text that merely looks like a call (which the loop may still recover) is not valid here:
    the measure is what the server returned as a call.
    """
    calls = (reply or {}).get("tool_calls") or []
    if not calls:
        return "cut_at_max_tokens" if (reply or {}).get("finish_reason") == "length" else "no_tool_call"
    fn = calls[0].get("function") or {}
    offered = {t["function"]["name"]: t["function"] for t in tools}
    if fn.get("name") not in offered:
        return "unknown_tool"
    try:
        args = json.loads(fn.get("arguments") or "")
    except (TypeError, ValueError):
        return "invalid_json"
    params = offered[fn["name"]].get("parameters") or {}
    return "schema_invalid" if schema_errors(args, params) else "valid"


@dataclass
class MeteredChat:
    """A chat callable that records each answered turn: seconds, and the call's verdict.

    Requests the server refused as too long (the loop trims and asks again) are counted
    apart; they are not turns the model answered.
    """

    chat: ChatFn
    turns: list[dict] = field(default_factory=list)
    refused_overlong: int = 0

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        t = time.perf_counter()
        try:
            reply = self.chat(messages, tools)
        except ContextOverflow:
            self.refused_overlong += 1
            raise
        self.turns.append({"s": round(time.perf_counter() - t, 3), "call": judge_call(reply, tools)})
        return reply

    def record(self) -> dict[str, Any]:
        valid = sum(t["call"] == "valid" for t in self.turns)
        secs = [t["s"] for t in self.turns]
        return {"turns": self.turns, "answered_turns": len(self.turns), "valid_calls": valid,
                "valid_call_rate": valid / len(self.turns) if self.turns else None,
                "s_per_turn": round(statistics.fmean(secs), 3) if secs else None,
                "refused_overlong": self.refused_overlong}


def run_one(task: Task, variant: str, chat: ChatFn, max_steps: int = 20, run: int = 1,
            system_prompt: str = SYSTEM_PROMPT) -> Outcome:
    device = task.make_device(variant)
    trace = run_agent(device, task.goal, chat, max_steps=max_steps, system_prompt=system_prompt)
    return task.evaluate(device, trace, variant=variant, run=run)


def format_run(o: Outcome, turns: dict | None = None) -> str:
    head = f"{'PASS' if o.success else 'fail'} {o.task}/{o.variant} #{o.run}"
    stats = f"{o.steps} steps, {o.noop_actions} no-op, {o.self_undos} self-undo, {o.recoveries} recovered"
    if turns and turns["answered_turns"]:
        stats += f", {turns['valid_calls']}/{turns['answered_turns']} valid calls, {turns['s_per_turn']:.2f} s/turn"
    return f"{head} ({stats})" + ("" if o.success else f": {o.failure_reason}")


def _turn_totals(records: list[dict]) -> dict[str, Any]:
    turns = [t for r in records for t in r["turns"]]
    valid = sum(t["call"] == "valid" for t in turns)
    secs = sorted(t["s"] for t in turns)
    verdicts: dict[str, int] = {}
    for t in turns:
        verdicts[t["call"]] = verdicts.get(t["call"], 0) + 1
    return {"answered_turns": len(turns), "valid_calls": valid,
            "valid_call_rate": valid / len(turns) if turns else None, "call_verdicts": verdicts,
            "s_per_turn": round(statistics.fmean(secs), 3) if secs else None,
            "s_per_turn_median": round(statistics.median(secs), 3) if secs else None}


def summarize(outcomes: list[Outcome], turns: list[dict] | None = None) -> dict:
    """Pass rates per task and overall; with ``turns`` (one :meth:`MeteredChat.record` per
    outcome, same order) also valid calls and seconds per turn."""
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
    if turns is not None:
        if len(turns) != len(outcomes):
            raise ValueError(f"{len(turns)} turn records for {len(outcomes)} outcomes")
        for name, t in per_task.items():
            mine = [(o, r) for o, r in zip(outcomes, turns) if o.task == name]
            t["mean_steps"] = statistics.fmean(o.steps for o, _ in mine)
            t.update(_turn_totals([r for _, r in mine]))
    n = len(outcomes)
    warnings = [f"{name}: only {t['runs']} run(s); fewer than {MIN_RUNS_PER_TASK} runs per task make the pass "
                f"rate noise (add variants or --repeat)" for name, t in per_task.items()
                if t["runs"] < MIN_RUNS_PER_TASK]
    out = {
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
    if turns is not None:
        out.update(_turn_totals(turns))
    return out


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
    if summary.get("answered_turns"):
        lines.append(f"valid calls: {summary['valid_calls']}/{summary['answered_turns']} turns "
                     f"({100 * summary['valid_call_rate']:.0f}%); {summary['s_per_turn']:.2f} s/turn "
                     f"(median {summary['s_per_turn_median']:.2f})")
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
    system_prompt: str = SYSTEM_PROMPT,
) -> dict:
    """All runs plus the summary; ``log`` receives one PASS/fail line per run as it finishes."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    outcomes, turns = [], []
    t0 = time.monotonic()
    for task in tasks:
        for variant in variants:
            for r in range(1, repeat + 1):
                metered = MeteredChat(chat)
                o = run_one(task, variant, metered, max_steps=max_steps, run=r, system_prompt=system_prompt)
                outcomes.append(o)
                turns.append(metered.record())
                if log:
                    log(format_run(o, turns[-1]))
    return {
        "summary": summarize(outcomes, turns),
        "runs": [o.to_dict() | t for o, t in zip(outcomes, turns)],
        "wall_s": round(time.monotonic() - t0, 3),
        "config": {"tasks": [t.name for t in tasks], "variants": list(variants), "repeat": repeat,
                   "max_steps": max_steps, "system_prompt": system_prompt},
    }


def write_report(path: str | os.PathLike, report: dict, extra_provenance: dict | None = None) -> None:
    """Atomically write the report with provenance (host, versions, build, env)."""
    from vllm_edge.common.atomic import write_json
    from vllm_edge.common.provenance import collect

    write_json(path, {"kind": "agent_suite", "provenance": collect(extra=extra_provenance), **report})
