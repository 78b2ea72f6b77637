"""bench/toolcalls: the verdict on one tool call, the schema subset, streamed calls joined."""

from __future__ import annotations

import json

import pytest

from vllm_edge.bench import prompts, toolcalls

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _msg(name, args):
    return {"tool_calls": [{"function": {"name": name, "arguments": args}}]}


@pytest.mark.parametrize("message,finish,choice,verdict", [
    (_msg("get_weather", '{"city": "Paris"}'), "stop", NAMED, "valid"),
    (_msg("get_weather", '{"city": "Paris", "unit": "kelvin"}'), "stop", NAMED, "schema_invalid"),
    (_msg("get_weather", '{"unit": "celsius"}'), "stop", NAMED, "schema_invalid"),
    (_msg("search_files", '{"directory": "/", "pattern": "*"}'), "stop", NAMED, "wrong_function"),
    (_msg("search_files", '{"directory": "/", "pattern": "*"}'), "stop", "required", "valid"),
    (_msg("get_weather", '{"city": "Par'), "stop", NAMED, "invalid_json"),
    (_msg("get_weather", '{"city": "Par'), "length", NAMED, "length"),
    ({"content": "<tool_call>..."}, "stop", NAMED, "missing"),
    ({"content": "<tool_call>..."}, "length", "required", "length"),
    (_msg("convert_currency", '{"amount": true, "from_currency": "USD", "to_currency": "EUR"}'),
     "stop", "required", "schema_invalid"),
])
def test_judge(message, finish, choice, verdict):
    assert toolcalls.judge(message, finish, choice, prompts.TOOLS) == verdict


def test_assemble_stream_joins_arguments_by_index():
    chunks = [
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "get_weather"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Lisbon"}'}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"completion_tokens": 9}},
    ]
    message, finish = toolcalls.assemble_stream(chunks)
    assert finish == "stop" and message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Lisbon"}


def test_unanswered_is_not_a_violation():
    cell = toolcalls.Cell(1.0, False)
    for verdict in ("valid", "length", "client_error:ReadTimeout"):
        cell.count(cell.verdicts, "tool_named", verdict)
    cell.count(cell.verdicts, "tool_required", "missing")
    s = cell.summary()
    assert s["constrained_calls"] == {"tool_named": 2, "tool_required": 1}
    assert s["unanswered"] == {"tool_named": 1, "tool_required": 0}
    assert s["violations"] == {"tool_named": 0, "tool_required": 1}


def test_parse_cells():
    assert toolcalls.parse_cells("0:stream, 1:nonstream") == [(0.0, True), (1.0, False)]
    for bad in ("0:fast", "hot:stream"):
        with pytest.raises(toolcalls.ToolStressError):
            toolcalls.parse_cells(bad)


@pytest.mark.parametrize("argv, needle", [
    (["--cells", "2:foo"], "cell '2:foo': write TEMPERATURE:stream or TEMPERATURE:nonstream"),
    (["--cells", "hot:stream"], "'hot' is not a temperature"),
    (["--base-url", "http://10.0.0.1:80"], "runs against loopback only"),
    (["--base-url", "http://127.0.0.1:9"], "127.0.0.1:9/v1/models: not a vLLM server answering"),
])
def test_cli_refuses_bad_arguments_clearly(tmp_path, argv, needle):
    from support.cli_runner import run_cli

    out = tmp_path / "out.json"
    proc = run_cli("bench", "toolcalls", *argv, "--calls", "1", "--out", str(out), timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
