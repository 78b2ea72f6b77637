"""Named tool calls against one real `vllm-edge serve`: every call valid, or cut by max_tokens.

A tool whose only argument is an enum containing ``</tool_call>`` makes the grammar write
the end tag inside a JSON string on every call, so the hermes parser bug
(patches/hermes_json_end.py) shows on each request instead of once in a few hundred.
Then a short burst of the stress client (named and required calls among abandoned streams
and over-long prompts, 8 clients) checks the same contract under load. Bounded: the burst
stops after its call budget or 90 s per cell.
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
