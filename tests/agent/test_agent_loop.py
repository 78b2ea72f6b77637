"""The loop: malformed-call recovery, no-op and self-undo detection, budget, and the message protocol."""

from __future__ import annotations

import json

import pytest

from vllm_edge.agent.calls import extract_calls, parse_json_lenient
from vllm_edge.agent.device import SimDevice
from vllm_edge.agent.loop import run_agent
from vllm_edge.agent.suite import run_one
from vllm_edge.agent.tasks import TASKS
from vllm_edge.bench.engines.chat import ContextOverflow
from vllm_edge.common.phone_tools import TOOL_NAMES, TOOLS


def raw_call(name, arguments, call_id="x1"):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


class Scripted:
    """Replays fixed replies, then hands over to ``then`` (or idles with no-op swipes)."""

    def __init__(self, replies, then=None):
        self.replies, self.then, self.seen = list(replies), then, []

    def __call__(self, messages, tools):
        self.seen.append(json.loads(json.dumps(messages)))
        if self.replies:
            return self.replies.pop(0)
        if self.then is not None:
            return self.then(messages, tools)
        return raw_call("swipe", '{"direction": "down"}')


def test_tools_schema():
    assert TOOL_NAMES == ("tap", "type_text", "swipe", "press_key", "open_app", "task_complete")
    for t in TOOLS:
        fn = t["function"]
        assert t["type"] == "function" and fn["parameters"]["type"] == "object"
        assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
    tap = TOOLS[0]["function"]["parameters"]
    assert tap["properties"]["index"]["type"] == "integer"


@pytest.mark.parametrize("raw, expected", [
    ('{"index": 3}', {"index": 3}),
    ("{'index': 3}", {"index": 3}),
    ('{"index": 3,}', {"index": 3}),
    ('```json\n{"index": 3}\n```', {"index": 3}),
    ('Sure: {"index": 3} done', {"index": 3}),
    ("", {}),
])
def test_parse_json_lenient(raw, expected):
    assert parse_json_lenient(raw)[0] == expected


def test_parse_json_lenient_gives_up():
    with pytest.raises(ValueError):
        parse_json_lenient("index is three")


@pytest.mark.parametrize("content, name, args", [
    ('{"name": "tap", "arguments": {"index": 2}}', "tap", {"index": 2}),
    ('<tool_call>\n{"name": "open_app", "arguments": {"name": "Clock"}}\n</tool_call>', "open_app", {"name": "Clock"}),
    ('I will tap it. ```json\n{"name": "tap", "parameters": {"index": 4}}\n```', "tap", {"index": 4}),
    ('{"function": {"name": "press_key", "arguments": "{\\"key\\": \\"BACK\\"}"}}', "press_key", {"key": "BACK"}),
    ('{"name": "swipe", "direction": "up"}', "swipe", {"direction": "up"}),
    ("Next: tap(5)", "tap", {"index": 5}),
    ('type_text(text="hello")', "type_text", {"text": "hello"}),
])
def test_text_tool_calls(content, name, args):
    [call] = extract_calls({"role": "assistant", "content": content})
    assert (call.name, call.arguments, call.source, call.error) == (name, args, "content", None)
    assert "text_tool_call" in call.repairs


def test_plain_text_is_not_a_call():
    assert extract_calls({"role": "assistant", "content": "The task is complete!"}) == []
    assert extract_calls({"role": "assistant", "content": None, "tool_calls": []}) == []


def test_recoveries_are_counted_and_the_task_still_passes(scripted):
    agent = scripted("wifi_on")
    chat = Scripted([
        raw_call("tap", "{'index': 7,}"),  # repaired JSON: taps Settings on the home screen
        raw_call("tap", "index seven"),  # unrecoverable JSON
        raw_call("Tap", '{"index": 1}'),  # tool name repaired: taps Wi-Fi
        raw_call("click", '{"index": 1}'),  # unknown tool
        raw_call("tap", "{}"),  # missing argument
        raw_call("tap", '{"index": 99}'),  # no such element
        raw_call("tap", '{"index": "2"}'),  # coerced: taps "Use Wi-Fi" on the Wi-Fi screen
        {"role": "assistant", "content": "Wi-Fi is on now."},  # no call at all
        {"role": "assistant", "content": '{"name": "task_complete", "arguments": {"summary": "on"}}'},
    ], then=agent)
    o = run_one(TASKS["wifi_on"], "base", chat)
    assert o.success, o.failure_reason
    assert o.recovery_kinds == {"bad_json": 1, "bad_json_unrecoverable": 1, "tool_name": 1, "unknown_tool": 1,
                                "bad_args": 2, "coerced_args": 1, "no_tool_call": 1, "text_tool_call": 1}
    assert o.recoveries == 9 and o.steps == 9
    assert agent.turns == 0  # the scripted replies did the whole task
    errors = [a["error"] for a in o.actions if a["error"]]
    assert any("unknown tool 'click'" in e for e in errors)
    assert any("needs the argument 'index'" in e for e in errors)
    assert any("no element [99]" in e for e in errors)


def test_model_is_told_about_errors_and_noops():
    chat = Scripted([raw_call("click", "{}"), raw_call("swipe", '{"direction": "down"}'),
                     raw_call("task_complete", '{"summary": "x"}')])
    run_agent(SimDevice(), "anything", chat)
    second, third = chat.seen[1], chat.seen[2]
    assert second[-1]["role"] == "tool" and second[-1]["content"].startswith("Error: unknown tool 'click'")
    assert "Current screen:\nApp: com.android.launcher3" in second[-1]["content"]
    assert "Swiped down. The screen did not change." in third[-1]["content"]


def test_only_task_complete_ends_the_run():
    chat = Scripted([{"role": "assistant", "content": "Done! The task is complete."}] * 4)
    trace = run_agent(SimDevice(), "x", chat, max_steps=4)
    assert not trace.declared_done and trace.stop_reason == "step budget exhausted"
    assert len(trace.steps) == 4 and trace.recovery_kinds == {"no_tool_call": 4}


def test_noop_and_self_undo_detection():
    d = SimDevice()
    chat = Scripted([
        raw_call("open_app", '{"name": "Settings"}'),
        raw_call("tap", '{"index": 0}'),  # the title: nothing happens
        raw_call("tap", '{"index": 2}'),  # airplane on
        raw_call("tap", '{"index": 2}'),  # airplane off: back to the screen before the previous action
        raw_call("tap", '{"index": 1}'),  # into Wi-Fi
        raw_call("press_key", '{"key": "back"}'),  # and out again: also a self-undo
        raw_call("type_text", '{"text": "hi"}'),  # no focused field
        raw_call("task_complete", '{"summary": "x"}'),
    ])
    trace = run_agent(d, "x", chat)
    assert [s.noop for s in trace.steps] == [False, True, False, False, False, False, True, False]
    assert [s.self_undo for s in trace.steps] == [False, False, False, True, False, True, False, False]
    assert trace.noop_actions == 2 and trace.self_undos == 2
    assert trace.steps[5].recoveries == ["coerced_args"]  # "back" -> "BACK"
    assert d.settings["airplane"] is False and d.events[-1]["new"] is False


def test_step_budget_and_chat_error():
    trace = run_agent(SimDevice(), "x", Scripted([]), max_steps=3)
    assert trace.stop_reason == "step budget exhausted" and len(trace.steps) == 3

    def broken(messages, tools):
        raise ConnectionError("server went away")
    o = run_one(TASKS["wifi_on"], "base", broken)
    assert o.error == "ConnectionError: server went away" and not o.success
    assert o.stop_reason == "chat error" and "error: ConnectionError" in o.failure_reason


def test_device_refusal_is_reported_to_the_model():
    chat = Scripted([raw_call("open_app", '{"name": "Alarm Pro"}'), raw_call("task_complete", "{}")])
    trace = run_agent(SimDevice(), "x", chat)
    assert trace.steps[0].error == "app 'Alarm Pro' is not installed"
    assert "Error: app 'Alarm Pro' is not installed" in chat.seen[1][-1]["content"]
    assert trace.declared_done and trace.steps[1].recoveries == ["coerced_args"]  # no summary given


def test_message_protocol_and_history_window():
    chat = Scripted([raw_call("swipe", '{"direction": "down"}', f"id{i}") for i in range(6)]
                    + [{"role": "assistant", "content": "tap(0)"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "a", "type": "function", "function": {"name": "swipe", "arguments": "{'direction': 'up'}"}},
                           {"id": "b", "type": "function", "function": {"name": "tap", "arguments": '{"index": 0}'}}]},
                       raw_call("task_complete", '{"summary": "x"}')])
    d = SimDevice()
    trace = run_agent(d, "the goal", chat, max_steps=10, keep_steps=3)
    assert trace.declared_done and len(trace.steps) == 9
    first = chat.seen[0]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"].startswith("Task: the goal\n\nCurrent screen:\nApp: com.android.launcher3")
    for msgs in chat.seen:
        assert sum("Current screen:" in (m.get("content") or "") for m in msgs) == 1
        for i, m in enumerate(msgs):
            if m["role"] == "tool":  # every tool reply answers a call of the assistant turn before it
                prev = next(p for p in reversed(msgs[:i]) if p["role"] == "assistant")
                assert m["tool_call_id"] in {c["id"] for c in prev["tool_calls"]}
            if m.get("tool_calls"):
                for c in m["tool_calls"]:
                    json.loads(c["function"]["arguments"])  # servers re-parse these
    last = chat.seen[-1]
    assert "(5 earlier steps are not shown.)" in last[1]["content"]
    assert [m["role"] for m in last[2:]] == ["assistant", "tool", "assistant", "user", "assistant", "tool", "tool"]
    assert last[5]["content"].startswith("Tapped [0] 'Phone'")  # the text call ran; a user message answers it
    assert d.foreground == "com.google.android.dialer"
    # two calls in one turn: only the first ran, and each got its own tool reply
    assert last[-2]["content"] == "Swiped up. The screen did not change."
    assert last[-1]["tool_call_id"] == "b" and last[-1]["content"].startswith("Ignored: only one action per turn.")
    assert trace.steps[7].tool == "swipe" and trace.steps[7].recoveries == ["bad_json"]


class Windowed:
    """A chat with a context window in characters: longer requests are refused like vLLM's 400."""

    def __init__(self, replies, window):
        self.replies, self.window, self.answered, self.refused = list(replies), window, [], 0

    def __call__(self, messages, tools):
        size = sum(len(m.get("content") or "") for m in messages)
        if size > self.window:
            self.refused += 1
            raise ContextOverflow(f"maximum context length exceeded: {size} > {self.window}")
        self.answered.append(size)
        return self.replies.pop(0)


def test_context_overflow_drops_old_turns_and_clips_rambling():
    ramble = {"role": "assistant", "content": "I think " * 400}  # 3200 chars, no tool call
    screen = len(run_agent.__globals__["uitree"].parse(SimDevice().dump_ui()).text())
    chat = Windowed([ramble] * 4 + [raw_call("task_complete", '{"summary": "done"}')], window=screen + 2500)
    trace = run_agent(SimDevice(), "the goal", chat, max_steps=10, keep_steps=6)
    assert trace.declared_done and len(trace.steps) == 5
    assert chat.refused > 0 and all(s <= chat.window for s in chat.answered)
    trimmed = sum(s.recoveries.count("context_trimmed") for s in trace.steps)
    assert trimmed == chat.refused  # each refusal cost one dropped turn, and was counted
    assert trace.recovery_kinds["no_tool_call"] == 4


def test_context_overflow_with_nothing_left_to_drop_is_a_chat_error():
    chat = Windowed([raw_call("task_complete", "{}")], window=10)
    o = run_one(TASKS["wifi_on"], "base", chat)
    assert o.stop_reason == "chat error" and not o.success and "ContextOverflow" in o.error
