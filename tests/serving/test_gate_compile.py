"""The gate's bound on grammar compile time (serving/gate_compile.py): schemas that are small
but slow for xgrammar to compile get a 400 naming the limit, within the budget, and the
worker that was compiling them is gone; real schemas pass, and each is compiled once.

These use the default model's tokenizer (the one the engine compiles against) and no engine."""

from __future__ import annotations

import json
import os
import time

import pytest

from vllm_edge.serving.gate import GateConfig, RequestGate
from vllm_edge.serving.gate_compile import targets

from starlette.testclient import TestClient  # noqa: E402

BUDGET_S = 2.0
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# Each string with a maxLength of 100 or more costs xgrammar about 2 s against this
# vocabulary (the schema_compile_time probe): twelve of them are ten times the budget.
SLOW_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000 + i}
                                                for i in range(12)}}
SLOW_REGEX = "".join(f"[^{c}]{{1,500}}" for c in "abcdefghij")
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"type": "string", "enum": ["c", "f"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city"]}}}


async def tiny_app(scope, receive, send):
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def gate(default_model_dir):
    g = RequestGate(tiny_app, GateConfig(tokenizer=str(default_model_dir),
                                         schema_compile_s=BUDGET_S))
    yield g
    g.compiler.close()


def _post(gate, body):
    t0 = time.monotonic()
    r = TestClient(gate).post("/v1/chat/completions", json=body)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SLOW_SCHEMA}}},
    {"structured_outputs": {"json": SLOW_SCHEMA}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": SLOW_SCHEMA}}],
     "tool_choice": "required"},
    # short, but each bounded repeat of a different negated class multiplies the states
    # xgrammar walks the vocabulary through: about 48 s here, over 20 times the budget
    {"structured_outputs": {"regex": SLOW_REGEX}},
], ids=["response_format", "structured_outputs", "tool", "regex"])
def test_a_schema_slow_to_compile_gets_a_400_naming_the_limit(gate, extra):
    gate.compiler.start()  # the worker's start is not the request's budget
    pid = gate.compiler.pid
    r, took = _post(gate, {**CHAT, **extra})
    assert r.status_code == 400, r.text
    assert "VLLM_EDGE_SCHEMA_COMPILE_S" in r.json()["error"]["message"], r.text
    assert took < BUDGET_S + 2.0, took
    # killed, not left compiling on a core
    assert pid is not None and not os.path.exists(f"/proc/{pid}/status")


def test_real_schemas_pass_and_are_compiled_once(gate):
    body = {**CHAT, "tools": [TOOL], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string",
                                                                      "maxLength": 20}}}}}}
    r, _ = _post(gate, body)
    assert r.status_code == 200, r.text
    specs = targets([("$.tools", body["tools"]), ("$.response_format", body["response_format"])])
    assert len(specs) == 2
    assert gate.compiler.check(specs) == 0.0  # both remembered: no time spent on them again


def test_a_spec_xgrammar_refuses_is_left_to_vllm(gate):
    r, _ = _post(gate, {**CHAT, "structured_outputs": {"grammar": "this is not a grammar ::= ("}})
    assert r.status_code == 200, r.text


def test_targets_are_what_the_engine_compiles():
    schema = {"type": "object", "properties": {"json": {"type": "string"},
                                               "regex": {"type": "string"}}}
    body = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        "structured_outputs": {"regex": "[a-z]+", "grammar": "root ::= \"a\"", "choice": ["a"]},
        "tools": [TOOL, {"type": "function", "name": "r", "parameters": {"type": "integer"}},
                  {"name": "anthropic", "input_schema": {"type": "number"}}],
        "text": {"format": {"type": "json_schema", "schema": {"type": "boolean"}}},
        "guided_regex": "b+",
    }
    from vllm_edge.serving.gate import _walk

    schemas: list = []
    list(_walk(body, schemas))
    found = {(w, k, s) for w, k, s in targets(schemas)}
    assert found == {
        ("response_format.json_schema.schema", "json", json.dumps(schema)),
        ("structured_outputs.regex", "regex", "[a-z]+"),
        ("structured_outputs.grammar", "grammar", 'root ::= "a"'),
        ("tools[0].function.parameters", "json", json.dumps(TOOL["function"]["parameters"])),
        ("tools[1].parameters", "json", '{"type": "integer"}'),
        ("tools[2].input_schema", "json", '{"type": "number"}'),
        ("text.format.schema", "json", '{"type": "boolean"}'),
        ("guided_regex", "regex", "b+"),
    }, found
