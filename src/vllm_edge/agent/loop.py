"""The agent loop: show the screen, ask the model for one action, perform it, repeat.

The loop never decides that a task is done; only the model's ``task_complete`` call does. It
records what an evaluation needs beyond pass/fail: actions that changed nothing, actions that
undid the previous one, and every malformed call it had to recover from.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from vllm_edge.agent import uitree
from vllm_edge.agent.calls import Call, extract_calls
from vllm_edge.agent.tools import TOOLS, Device, ToolError, execute, validate
from vllm_edge.common.errors import EdgeError

ChatFn = Callable[[list[dict], list[dict]], dict]

# A reply without a tool call goes back into the history clipped to this: a small model's
# rambling would otherwise fill the context window within a few turns.
MAX_STORED_TEXT = 600


class ContextOverflow(EdgeError):
    """The request (history + screen + reply budget) does not fit the model's context.

    Chat functions raise it so the loop can drop old turns and ask again.
    """

SYSTEM_PROMPT = """You operate an Android phone to complete a task for the user.
Each turn you see the current screen as a numbered list of elements: [index] type "label", then
details and states such as [on], [off], [selected], [focused].
Call exactly one tool per turn:
- tap(index) taps an element;
- type_text(text) types into the focused field (tap the field first);
- swipe(direction) scrolls; "up" shows more of a list below;
- press_key(key) presses BACK, HOME, ENTER or DEL;
- open_app(name) launches an app.
Change nothing the task does not ask for. When the task is done, or if it was already done,
call task_complete(summary)."""


@dataclass
class Step:
    n: int
    tool: str | None = None
    args: dict[str, Any] | None = None
    result: str = ""
    noop: bool = False  # the UI dump was identical before and after
    self_undo: bool = False  # the screen went back to how it was before the previous action
    recoveries: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    declared_done: bool = False
    summary: str | None = None
    stop_reason: str = ""
    error: str | None = None  # chat or device failure: not the model's fault

    @property
    def noop_actions(self) -> int:
        return sum(s.noop for s in self.steps)

    @property
    def self_undos(self) -> int:
        return sum(s.self_undo for s in self.steps)

    @property
    def recovery_kinds(self) -> dict[str, int]:
        return dict(Counter(k for s in self.steps for k in s.recoveries))

    @property
    def recoveries(self) -> int:
        return sum(len(s.recoveries) for s in self.steps)

    def to_dict(self) -> dict:
        return {
            "declared_done": self.declared_done, "summary": self.summary, "stop_reason": self.stop_reason,
            "error": self.error, "steps": [asdict(s) for s in self.steps],
        }


def _assistant_record(reply: dict, calls: list[Call]) -> dict:
    """The assistant turn as it goes back into the history.

    Arguments are re-serialised from what was parsed: servers re-parse them when rendering the
    chat template, and a malformed string there would fail every later request.
    """
    msg: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or None}
    if not calls and msg["content"] and len(msg["content"]) > MAX_STORED_TEXT:
        msg["content"] = msg["content"][:MAX_STORED_TEXT] + " [...]"
    if calls and calls[0].source == "tool_calls":
        msg["tool_calls"] = [{
            "id": c.id, "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments or {})},
        } for c in calls]
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


class _History:
    """Messages for the next request. Only the newest message carries the screen; older turns
    are dropped beyond ``keep_steps`` so a small context window is not exceeded."""

    def __init__(self, goal: str, keep_steps: int, system_prompt: str):
        self.goal, self.keep, self.system = goal, keep_steps, system_prompt
        self.turns: list[list[dict]] = []

    def add(self, assistant: dict, feedback: list[dict]) -> None:
        self.turns.append([assistant, *feedback])

    def shrink(self) -> bool:
        """Keep one turn fewer from now on; False when no turn is left to drop."""
        shown = min(self.keep, len(self.turns))
        if shown == 0:
            return False
        self.keep = shown - 1
        return True

    def messages(self, screen: str) -> list[dict]:
        kept = self.turns[-self.keep:] if self.keep > 0 else []
        dropped = len(self.turns) - len(kept)
        task = f"Task: {self.goal}"
        if dropped:
            task += f"\n({dropped} earlier steps are not shown.)"
        msgs = [{"role": "system", "content": self.system}, {"role": "user", "content": task}]
        for turn in kept:
            msgs += [dict(m) for m in turn]
        text = f"Current screen:\n{screen}"
        if len(msgs) == 2:
            msgs[1]["content"] = f"{task}\n\n{text}"
        else:
            msgs[-1]["content"] = f"{msgs[-1]['content']}\n\n{text}"
        return msgs


def _feedback(calls: list[Call], text: str) -> list[dict]:
    """One tool message per tool call id (the API requires it), else a user message."""
    if calls and calls[0].source == "tool_calls":
        out = [{"role": "tool", "tool_call_id": calls[0].id, "content": text}]
        out += [{"role": "tool", "tool_call_id": c.id, "content": "Ignored: only one action per turn."}
                for c in calls[1:]]
        return out
    return [{"role": "user", "content": text}]


def run_agent(
    device: Device,
    goal: str,
    chat: ChatFn,
    max_steps: int = 15,
    keep_steps: int = 6,
    system_prompt: str = SYSTEM_PROMPT,
) -> Trace:
    """Run one task until the model calls task_complete, the step budget runs out, or chat fails.

    ``max_steps`` counts model turns, including turns spent on malformed calls.
    """
    trace = Trace()
    history = _History(goal, keep_steps, system_prompt)
    try:
        xml = device.dump_ui()
        tree = uitree.parse(xml)
    except Exception as exc:  # a device we cannot read is not a model failure
        trace.stop_reason, trace.error = "device error", f"dump_ui failed: {exc}"
        return trace
    before_previous: str | None = None  # dump before the previous executed action

    for n in range(1, max_steps + 1):
        step = Step(n)
        trace.steps.append(step)
        try:
            while True:
                try:
                    reply = chat(history.messages(tree.text()), TOOLS)
                    break
                except ContextOverflow:
                    if not history.shrink():
                        raise
                    step.recoveries.append("context_trimmed")
        except Exception as exc:
            trace.stop_reason, trace.error = "chat error", f"{type(exc).__name__}: {exc}"
            step.error = trace.error
            return trace
        calls = extract_calls(reply or {}, n)
        assistant = _assistant_record(reply or {}, calls)
        if not calls:
            step.recoveries.append("no_tool_call")
            step.error = "no tool call"
            history.add(assistant, [{"role": "user", "content":
                                     "You did not call a tool. Call exactly one tool, or task_complete if done."}])
            continue
        call = calls[0]
        step.tool, step.args = call.name, call.arguments
        step.recoveries += call.repairs
        if call.error:
            step.recoveries.append(call.error_kind or "bad_call")
            step.error = call.error
            history.add(assistant, _feedback(calls, f"Error: {call.error}"))
            continue
        try:
            args, coerced = validate(call.name, call.arguments or {}, tree)
        except ToolError as exc:
            step.recoveries.append("bad_args")
            step.error = str(exc)
            history.add(assistant, _feedback(calls, f"Error: {exc}"))
            continue
        if coerced:
            step.recoveries.append("coerced_args")
        step.args = args
        if call.name == "task_complete":
            trace.declared_done, trace.summary, trace.stop_reason = True, args["summary"], "task_complete"
            step.result = "task_complete"
            return trace
        before = xml
        try:
            step.result = execute(device, tree, call.name, args)
        except ValueError as exc:  # the device refused a well-formed action, e.g. no such app
            step.error = str(exc)
            history.add(assistant, _feedback(calls, f"Error: {exc}"))
            continue
        except Exception as exc:
            trace.stop_reason, trace.error = "device error", f"{type(exc).__name__}: {exc}"
            step.error = trace.error
            return trace
        try:
            xml = device.dump_ui()
            tree = uitree.parse(xml)
        except Exception as exc:
            trace.stop_reason, trace.error = "device error", f"dump_ui failed: {exc}"
            return trace
        step.noop = xml == before
        step.self_undo = not step.noop and before_previous is not None and xml == before_previous
        before_previous = before
        note = step.result + "." + (" The screen did not change." if step.noop else "")
        history.add(assistant, _feedback(calls, note))

    trace.stop_reason = "step budget exhausted"
    return trace
