"""Constrained decoding against one real `vllm-edge serve`: every call valid, or cut by max_tokens.

A tool whose only argument is an enum containing ``</tool_call>`` makes the grammar write
the end tag inside a JSON string on every call, so the hermes parser bug
(patches/hermes_json_end.py) shows on each request instead of once in a few hundred.
Then a short burst of the stress client (named and required calls among abandoned streams
and over-long prompts, 8 clients) checks the same contract under load. Bounded: the burst
stops after its call budget or 90 s per cell.

The constrained modes a client can ask for (``tool_choice`` required or named,
``response_format`` json_schema, streamed or not) are each checked against the schema with
the `jsonschema` package, next to the same request unconstrained; the engine core runs
vLLM's ``auto`` backend, which keeps xgrammar for these schemas, and a new schema waits there
for its compile while a cached one does not; bad schemas get a 400; the agent suite's
constrained mode runs one short task; and `bench constrained` times compile against cache.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow
httpx = pytest.importorskip("httpx")

TIMEOUT = 600
TAGGED = {"type": "function", "function": {
    "name": "label_text", "description": "Attach a label to a text.",
    "parameters": {"type": "object", "properties": {
        "label": {"type": "string", "enum": ["see </tool_call> here", "</tool_call>"]}},
        "required": ["label"]}}}


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    from vllm_edge.bench import soak

    port = soak.free_port()
    log = tmp_path_factory.mktemp("toolcalls") / "server.log"
    proc = soak.start_server(["default", "--enforce-eager"], port, log)
    yield {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log}
    assert soak.stop_server(proc) is not None, "the server did not stop"


def test_xgrammar_compiles_the_json_schema_grammars_in_the_engine_core(server):
    """The engine core (CPU) runs vLLM's ``auto`` backend, which keeps xgrammar for a schema
    xgrammar's own check accepts; a new schema then waits in the engine's queue while it is
    compiled, and the same schema again comes from the compiler cache and does not.

    First in the module on purpose: the engine core builds one backend, from the first
    constrained request it gets, and compiles every later grammar (tool calls too) with it."""
    import secrets

    from vllm_edge.bench import constrained

    log = server["log"].read_text(errors="replace")
    config = next(ln for ln in log.splitlines() if "StructuredOutputsConfig(" in ln)
    assert "EngineCore" in config and "device_config=cpu" in config, config
    assert constrained.backend_setting(config) == "auto", config
    nonce = secrets.token_hex(4)
    assert constrained.resolved_backend("auto", [constrained.action_schema(nonce)]) == "xgrammar"

    def send(kind: str) -> dict:
        body = constrained.request_body("json_schema", kind, nonce, secrets.token_hex(4), "default",
                                        2 * constrained.MAX_TOKENS)
        r = constrained.stream_once(server["url"], body)
        r["verdict"] = constrained.verdict("json_schema", body, r["message"], r["finish_reason"], nonce)
        return r

    new, cached, free = send("cold"), send("warm"), send("free")
    print({k: {f: r[f] for f in ("queue_s", "ttft_s", "verdict")} for k, r in
           (("new", new), ("cached", cached), ("free", free))})
    assert new["verdict"] == cached["verdict"] == "valid", (new, cached)
    assert free["verdict"] != "valid", free
    assert new["queue_s"] is not None and cached["queue_s"] is not None
    assert new["queue_s"] > cached["queue_s"], (new["queue_s"], cached["queue_s"])


def _named_body(stream: bool, temperature: float) -> dict:
    from vllm_edge.bench import prompts

    return {"model": "default", "max_tokens": 64, "temperature": temperature,
            "messages": [{"role": "user", "content": "Label the text 'hello world'."}],
            "tools": [TAGGED, *prompts.TOOLS],
            "tool_choice": {"type": "function", "function": {"name": "label_text"}},
            **({"stream": True} if stream else {})}


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_named_call_with_the_end_tag_in_an_argument(server, stream, temperature):
    from vllm_edge.bench import prompts, toolcalls

    body = _named_body(stream, temperature)
    if stream:
        chunks = []
        with httpx.stream("POST", server["url"] + "/v1/chat/completions", json=body,
                          timeout=TIMEOUT) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
        message, finish = toolcalls.assemble_stream(chunks)
    else:
        resp = httpx.post(server["url"] + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert resp.status_code == 200, resp.text[:300]
        choice = resp.json()["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
    verdict = toolcalls.judge(message, finish, body["tool_choice"], [TAGGED, *prompts.TOOLS])
    assert verdict in ("valid", "length"), (verdict, finish, message)
    if verdict == "valid":
        assert "</tool_call>" in json.loads(message["tool_calls"][0]["function"]["arguments"])["label"]


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_named_and_required_calls_under_load(server, stream):
    from vllm_edge.bench import toolcalls

    cell = toolcalls.run_cell(server["url"], temperature=1.0, stream=stream, calls=16,
                              clients=8, max_seconds=90)
    s = cell.summary()
    print(json.dumps({k: s[k] for k in ("wall_s", "requests", "verdicts", "soak_classes")}))
    assert sum(s["constrained_calls"].values()) >= 4, s["requests"]
    assert s["violations"] == {"tool_named": 0, "tool_required": 0}, s["failures_sample"]
    assert s["unanswered"] == {"tool_named": 0, "tool_required": 0}, s["failures_sample"]
    assert server["proc"].poll() is None


# --- the constrained modes, each validated with jsonschema against its own schema ---------

jsonschema = pytest.importorskip("jsonschema")
ASK = [{"role": "user", "content": "The screen shows [0] Settings, [1] Clock. Open the Clock app."}]


def _bounded_tools() -> list[dict]:
    """The phone tools with every string argument at most 40 characters. At temperature 0 this
    135M model can loop inside a free string ("settings_app_name_to_use_for_app_name_..."),
    and a call cut at max_tokens is no JSON at all, whatever the engine constrains: the bound
    lets the grammar close the string, so what is checked is the constraint, not the model."""
    import copy

    from vllm_edge.common.phone_tools import TOOLS

    tools = copy.deepcopy(TOOLS)
    for t in tools:
        for prop in t["function"]["parameters"]["properties"].values():
            if prop.get("type") == "string":
                prop["maxLength"] = 40
    return tools


def _chat(server, body: dict) -> dict:
    resp = httpx.post(server["url"] + "/v1/chat/completions", json={"model": "default", "temperature": 0, **body},
                      timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()["choices"][0]


def _valid_call(call: dict, tools: list[dict], name: str | None = None) -> dict:
    """The call names an offered tool (``name`` if given) and its arguments satisfy its schema."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    fn = call["function"]
    assert fn["name"] in by_name and (name is None or fn["name"] == name), fn
    args = json.loads(fn["arguments"])
    jsonschema.validate(args, by_name[fn["name"]])
    return args


def test_required_call_is_schema_valid_and_auto_is_not_a_call(server):
    TOOLS = _bounded_tools()
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 64}
    forced = _chat(server, {**body, "tool_choice": "required"})
    assert forced["finish_reason"] == "tool_calls", forced
    _valid_call(forced["message"]["tool_calls"][0], TOOLS)
    free = _chat(server, {**body, "tool_choice": "auto"})  # same request, same T=0, no constraint
    print("required:", forced["message"]["tool_calls"][0]["function"], "| auto:", free["message"])
    assert free["message"] != forced["message"]


def test_named_call_is_schema_valid(server):
    TOOLS = _bounded_tools()
    for name in ("press_key", "tap", "open_app"):
        out = _chat(server, {"messages": ASK, "tools": TOOLS, "max_tokens": 64,
                             "tool_choice": {"type": "function", "function": {"name": name}}})
        args = _valid_call(out["message"]["tool_calls"][0], TOOLS, name)
        print(name, args)


def test_streamed_required_call_is_schema_valid(server):
    from vllm_edge.bench import toolcalls

    TOOLS = _bounded_tools()

    body = {"model": "default", "temperature": 0, "messages": ASK, "tools": TOOLS, "max_tokens": 64,
            "tool_choice": "required", "stream": True}
    chunks = []
    with httpx.stream("POST", server["url"] + "/v1/chat/completions", json=body, timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    message, finish = toolcalls.assemble_stream(chunks)
    assert finish == "tool_calls" and len(message["tool_calls"]) >= 1, (finish, message)
    assert sum(1 for c in chunks for ch in c["choices"] if (ch.get("delta") or {}).get("tool_calls")) > 1
    _valid_call(message["tool_calls"][0], TOOLS)


def test_response_format_json_schema_is_valid_and_free_output_is_not(server):
    from vllm_edge.bench import constrained

    schema = constrained.action_schema("a1b2")
    msgs = [{"role": "user", "content": "Screen: [0] Settings [1] Clock. Task: open the Clock. Next action?"}]
    # the grammar allows whitespace anywhere and the model uses it: a whole object takes ~45 tokens
    forced = _chat(server, {"messages": msgs, "max_tokens": 2 * constrained.MAX_TOKENS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "action", "schema": schema, "strict": True}}})
    assert forced["finish_reason"] == "stop", forced  # a complete object, not one cut by max_tokens
    jsonschema.validate(json.loads(forced["message"]["content"]), schema)
    free = _chat(server, {"messages": msgs, "max_tokens": 2 * constrained.MAX_TOKENS})
    print("json_schema:", forced["message"]["content"], "| free:", free["message"]["content"])
    assert free["message"]["content"] != forced["message"]["content"]
    try:
        jsonschema.validate(json.loads(free["message"]["content"]), schema)
    except (ValueError, jsonschema.ValidationError):
        pass  # prose, or JSON of another shape: the constraint is what made it valid
    else:
        pytest.fail("the unconstrained answer satisfied the schema too: nothing shows the grammar worked")


def test_bench_constrained_against_this_server(server):
    from vllm_edge.bench import constrained

    r = constrained.run_against(server["url"], server["log"], schemas=1, repeats=1)
    print(json.dumps({m: {k: s[k] for k in ("compile_s_estimate", "constrained_valid_rate", "free_valid_rate")}
                      for m, s in r["summary"].items()}))
    for mode in constrained.MODES:
        mine = [x for x in r["rows"] if x["mode"] == mode and x["kind"] != "free"]
        # each constrained answer satisfies its constraint, or was cut by max_tokens mid-answer
        assert {x["verdict"] for x in mine} <= {"valid", "length"}, mine
        assert any(x["verdict"] == "valid" for x in mine), mine
        assert all(x["queue_s"] is not None for x in r["rows"] if x["mode"] == mode)
    assert r["summary"]["json_schema"]["free_valid_rate"] == 0.0
    assert r["structured_outputs"] == {"setting": "auto", "json_schema_backend": "xgrammar"}


# --- the agent suite's constrained mode on one short task -------------------------------

def test_agent_constrained_turns_are_all_valid_calls(server, tmp_path):
    from support.cli_runner import run_cli

    out = tmp_path / "agent.json"
    r = run_cli("agent", "run", "--base-url", server["url"] + "/v1", "--model", "default", "--constrained",
                "--tasks", "wifi_already_on", "--variants", "base", "--max-steps", "3", "--max-tokens", "96",
                "--out", str(out), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    run = data["runs"][0]
    print(r.stdout)
    assert data["config"]["tool_choice"] == "required" and run["answered_turns"] >= 1
    # every turn is a call the loop can act on: a tool it offered, arguments its schema accepts
    assert [t["call"] for t in run["turns"]] == ["valid"] * run["answered_turns"], run["turns"]
    assert not any(k in run["recovery_kinds"] for k in ("no_tool_call", "text_tool_call", "bad_json",
                                                        "bad_json_unrecoverable", "unknown_tool"))


# --- bad schemas: a 400 that names the problem, and the server keeps serving -------------

BAD_SCHEMAS = {
    "unknown_type": {"type": "nonsense"},
    "unresolvable_ref": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    "bad_pattern": {"type": "string", "pattern": "(unclosed"},
}


@pytest.mark.parametrize("case", list(BAD_SCHEMAS))
@pytest.mark.parametrize("where", ["response_format", "tool_parameters"])
def test_bad_schema_gets_a_400(server, case, where):
    schema = BAD_SCHEMAS[case]
    body: dict = {"model": "default", "max_tokens": 8, "messages": ASK}
    if where == "response_format":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": schema}, "required": ["a"]}}}]
        body["tool_choice"] = "required"
    resp = httpx.post(server["url"] + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    print(case, where, resp.status_code, resp.text[:300])
    assert resp.status_code == 400, resp.text[:500]
    assert resp.json()["error"]["message"]
    assert server["proc"].poll() is None
    assert httpx.get(server["url"] + "/health", timeout=60).status_code == 200
