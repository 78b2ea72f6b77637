"""Who and what gets past the serve gate: the API key on every route vLLM 0.32 mounts (the
route list comes from vLLM's own app builder, which needs no engine), the Host rule of a
keyless loopback server, the body deadline, the fan-out cap with ``n`` read as pydantic reads
it, schema bounds, and the Anthropic image source that carries both a url and data."""

from __future__ import annotations

import asyncio
import json
import re
from typing import get_args

import pytest

from support.image_samples import good_url
from vllm_edge.serving import gate as gate_mod
from vllm_edge.serving.gate import FANOUT, OPEN_PATHS, STATUS_PATH, GateConfig, RequestGate

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402

KEY, MAX_N = "s3cret", 4
AUTH = {"Authorization": f"Bearer {KEY}"}
# Routes vLLM mounts only with a pooling model's config or in dev mode: the gate is
# path-agnostic, these keep the walk honest about them.
EXTRA_ROUTES = [("POST", "/pooling"), ("POST", "/v1/embeddings"), ("POST", "/score"),
                ("POST", "/v1/score"), ("POST", "/rerank"), ("POST", "/v1/rerank"),
                ("POST", "/classify"), ("POST", "/v1/load_lora_adapter"),
                ("POST", "/reset_prefix_cache"), ("POST", "/sleep"), ("POST", "/wake_up"),
                ("POST", "/collective_rpc"), ("GET", "/server_info"), ("GET", "/metrics/"),
                ("GET", STATUS_PATH), ("GET", "/"), ("GET", "/HEALTH"), ("GET", "/health/../invocations")]


def vllm_routes() -> list[tuple[str, str, str]]:
    """(kind, method, path) of every route vLLM 0.32's API server mounts, built the way
    `serve` builds it (vLLM's build_app) for every task, without an engine."""
    from vllm import tasks
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    every = tuple(get_args(tasks.GenerationTask)) + tuple(get_args(tasks.PoolingTask)) + tuple(
        get_args(tasks.FrontendTask))
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--api-key", KEY])
    app = build_app(args, supported_tasks=every)
    out = []
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        if type(route).__name__ == "APIWebSocketRoute":
            out.append(("websocket", "GET", path))
        else:
            for method in sorted(getattr(route, "methods", None) or {"GET", "POST"}):
                out.append(("http", method, path))
    return out


@pytest.fixture(scope="module")
def routes():
    found = vllm_routes()
    paths = {p for _, _, p in found}
    # the routes the probe found open, and the ones vLLM guards, are all in the walk
    assert {"/invocations", "/tokenize", "/detokenize", "/metrics", "/v1/models",
            "/v1/chat/completions", "/v1/realtime", "/health"} <= paths, sorted(paths)
    return found + [("http", m, p) for m, p in EXTRA_ROUTES]


async def tiny_app(scope, receive, send):
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def client(**kw) -> TestClient:
    kw.setdefault("max_n", MAX_N)
    return TestClient(RequestGate(tiny_app, GateConfig(**kw)))


def test_the_key_guards_every_route_vllm_mounts(routes):
    c = client(api_keys=(KEY,))
    for kind, method, path in routes:
        if kind == "websocket":
            with pytest.raises(WebSocketDisconnect):
                with c.websocket_connect(path) as ws:
                    ws.receive_text()
            with c.websocket_connect(path, headers=AUTH) as ws:  # accepted with the key
                with pytest.raises(WebSocketDisconnect):
                    ws.receive_text()
            continue
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        open_ = path in OPEN_PATHS
        r = c.request(method, path, content=body)
        assert (r.status_code != 401) if open_ else (r.status_code == 401), (method, path, r.status_code)
        for wrong in ({"Authorization": "Bearer nope"}, {"Authorization": KEY},
                      {"Authorization": f"Basic {KEY}"}):
            if not open_:
                assert c.request(method, path, content=body, headers=wrong).status_code == 401
        r = c.request(method, path, content=body, headers=AUTH)
        assert r.status_code != 401, (method, path)


def test_the_key_is_checked_before_the_body_is_read():
    read = []

    async def app(scope, receive, send):  # never reached
        read.append(scope["path"])

    async def receive():
        read.append("body")
        return {"type": "http.request", "body": b"{}", "more_body": False}

    sent = []

    async def send(msg):
        sent.append(msg)

    gate = RequestGate(app, GateConfig(api_keys=(KEY,)))
    scope = {"type": "http", "method": "POST", "path": "/invocations", "headers": []}
    asyncio.run(gate(scope, receive, send))
    assert sent[0]["status"] == 401 and read == []


def test_a_cors_preflight_passes_but_a_bare_options_does_not():
    c = client(api_keys=(KEY,))
    pre = {"Origin": "http://a", "Access-Control-Request-Method": "POST"}
    assert c.options("/invocations", headers=pre).status_code == 200
    assert c.options("/invocations").status_code == 401


@pytest.mark.parametrize("host, ok", [
    ("localhost", True), ("localhost:8000", True), ("127.0.0.1", True), ("127.0.0.1:8000", True),
    ("127.3.4.5:1", True), ("[::1]", True), ("[::1]:8000", True), ("LOCALHOST:80", True),
    ("evil.example", False), ("evil.example:8000", False), ("127.0.0.1.evil.example", False),
    ("localhost.evil.example", False), ("0.0.0.0:8000", False), ("[::1]x", False),
])
def test_a_keyless_loopback_server_answers_only_loopback_host_names(host, ok):
    c = client(loopback_hosts_only=True)
    r = c.post("/v1/chat/completions", json={"messages": []}, headers={"host": host})
    assert r.status_code == (200 if ok else 403), r.text
    if not ok:
        assert "Host header" in r.json()["error"]["message"]


def test_a_server_with_a_key_or_off_loopback_takes_any_host():
    assert client().post("/v1/completions", json={}, headers={"host": "a.example"}).status_code == 200


def test_a_slow_body_gets_a_408():
    sent = []

    async def receive():
        await asyncio.sleep(5)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        sent.append(msg)

    gate = RequestGate(tiny_app, GateConfig(body_timeout_s=0.2))
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(asyncio.wait_for(gate(scope, receive, send), 3))
    assert sent[0]["status"] == 408
    assert b"did not arrive within 0.2 s" in sent[1]["body"]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("n", [16, "16", 16.0, "16.0", " 16 ", "1_6"])
def test_n_is_read_as_vllm_reads_it(n):
    r = client().post("/v1/chat/completions", json={**CHAT, "n": n})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert f"at most {MAX_N}" in r.json()["error"]["message"]


@pytest.mark.parametrize("n", [16.5, "x", [1], {"a": 1}])
def test_n_that_is_no_integer_is_refused(n):
    r = client().post("/v1/chat/completions", json={**CHAT, "n": n})
    assert r.status_code == 400 and "expected an integer" in r.json()["error"]["message"]


def test_n_within_the_cap_passes():
    for n in (1, "4", 4.0, True, None):
        assert client().post("/v1/chat/completions", json={**CHAT, "n": n}).status_code == 200


def test_sampling_params_n_is_capped():
    r = client().post("/inference/v1/generate",
                      json={"token_ids": [1], "sampling_params": {"n": "9"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.n"


CAP = FANOUT * MAX_N


@pytest.mark.parametrize("body, seqs", [
    ({"prompt": ["p"] * 200, "n": 4}, 800),  # the probe: 800 sequences on max-num-seqs 4
    ({"prompt": ["p"] * (CAP + 1)}, CAP + 1),
    ({"prompt": [[1, 2]] * 9, "n": 2}, 18),
    ({"prompt": ["p"] * 5, "n": "4"}, 20),
    ({"messages": [[{"role": "user", "content": "hi"}]] * (CAP + 1)}, CAP + 1),
    ({"messages": [[{"role": "user", "content": "hi"}]] * 5, "n": 4}, 20),
])
def test_fan_out_over_the_cap_gets_a_400_naming_it(body, seqs):
    route = "/v1/completions" if "prompt" in body else "/v1/chat/completions/batch"
    r = client().post(route, json=body)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert f"= {seqs} sequences" in msg and f"at most {CAP} per request" in msg
    assert f"{FANOUT} x its --max-num-seqs {MAX_N}" in msg


@pytest.mark.parametrize("body", [
    {"prompt": ["p"] * CAP}, {"prompt": ["p"] * 4, "n": 4}, {"prompt": list(range(5000))},
    {"prompt": "one", "n": 4}, {"messages": [[{"role": "user", "content": "hi"}]] * CAP},
])
def test_fan_out_at_the_cap_passes(body):
    route = "/v1/completions" if "prompt" in body else "/v1/chat/completions/batch"
    assert client().post(route, json=body).status_code == 200


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("body, needle", [
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _nested(20)}}}, "nested"),
    ({**CHAT, "structured_outputs": {"json": _nested(20)}}, "nested"),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {
            f"p{i}": {"type": "string", "description": "d" * 100} for i in range(2000)}}}}},
     "MAX_SCHEMA_BYTES"),
    ({**CHAT, "structured_outputs": {"grammar": "root ::= " + "\"a\" " * 70_000}}, "MAX_SCHEMA_BYTES"),
])
def test_schemas_over_the_bounds_get_a_400(body, needle):
    r = client().post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_a_real_tool_schema_passes():
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": _nested(6)}}
             for i in range(20)]
    assert client().post("/v1/chat/completions", json={**CHAT, "tools": tools}).status_code == 200


def _anthropic(source: dict) -> dict:
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": source}]}]}


@pytest.mark.parametrize("source", [
    # vLLM decodes data unless type is "url": a tiny url beside a huge or bad data
    {"type": "weird", "url": good_url(), "data": "QUFB" * 10},
    {"url": good_url(), "data": "QUFB" * 10, "media_type": "image/png"},
    # and the url when type is "url": a good data beside a remote url
    {"type": "url", "url": "http://example.com/a.png", "data": good_url().split(",", 1)[1]},
    {"type": "base64", "media_type": "image/png", "data": good_url().split(",", 1)[1],
     "url": "http://example.com/a.png"},
])
def test_anthropic_image_url_and_data_are_both_checked(source):
    r = client().post("/v1/messages", json=_anthropic(source))
    assert r.status_code in (400, 413, 415), r.text


def test_a_good_anthropic_image_passes():
    mime, data = good_url()[5:].split(";base64,")
    r = client().post("/v1/messages", json=_anthropic({"type": "base64", "media_type": mime,
                                                       "data": data}))
    assert r.status_code == 200, r.text


def test_status_needs_the_key():
    c = client(api_keys=(KEY,))
    assert c.get(STATUS_PATH).status_code == 401
    r = c.get(STATUS_PATH, headers=AUTH)
    assert r.status_code == 200 and "pid" in r.json()


def test_the_gate_module_serves_no_key_in_errors():
    c = client(api_keys=(KEY,))
    assert KEY not in c.post("/invocations", json={}).text
    assert json.loads(c.post("/invocations", json={}).text)["error"]["code"] == 401
    gate_mod.configure(None)


def test_a_lone_surrogate_in_a_schema_string_gets_a_400_naming_it():
    # JSON may escape one (\ud83d); the size bound encoded it as strict UTF-8 and raised (a 500)
    r = client().post("/v1/chat/completions", content=b'{"messages": [], "guided_json": "a\\ud83d"}',
                      headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json", r.text


# The one 5xx left by the fuzz (seed 0, case 2071): vLLM 0.32 puts kv_transfer_params in the
# sampling params' extra_args and msgpack-encodes them for the engine; the lone surrogate
# raised UnicodeEncodeError there.
FUZZ_KV_BODY = (b'{"model": "default", "prompt": [1, 2, 3], "max_tokens": 1, "kv_transfer_params": '
                b'{"content": [{"role": [null], "content": [-Infinity, 2147483648], "model": '
                b'{"content": true, "n": "\xed\xa0\x80"}}], "role": {"n": false, "x": "{}"}, "n": []}}')


@pytest.mark.parametrize("kv", [{"do_remote_prefill": True}, {}, "x", [1]])
def test_kv_transfer_params_without_a_connector_get_a_400_naming_it(kv):
    r = client().post("/v1/completions", json={"prompt": "hi", "kv_transfer_params": kv})
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text


def test_the_fuzz_kv_transfer_body_gets_a_400():
    r = client().post("/v1/completions", content=FUZZ_KV_BODY,
                      headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text


def test_kv_transfer_params_pass_with_a_connector_or_when_null():
    assert client().post("/v1/completions", json={"prompt": "hi", "kv_transfer_params": None}
                         ).status_code == 200
    r = client(kv_connector=True).post("/v1/completions", json={
        "prompt": "hi", "kv_transfer_params": {"do_remote_prefill": True}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("flags, on", [([], False), (["--kv-transfer-config", "{}"], True),
                                       (["--kv_transfer_config={}"], True),
                                       (["--kv-events-config", "{}"], False)])
def test_a_kv_connector_is_seen_in_the_users_vllm_flags(flags, on):
    from vllm_edge.serving.serve import kv_connector_flag

    assert kv_connector_flag(flags) is on


@pytest.mark.parametrize("raw, param", [
    (b'{"prompt": "hi\\ud800"}', "prompt"),
    (b'{"prompt": ["ok", "\\udfff x"]}', "prompt[1]"),
    (b'{"prompt": "hi", "stop": ["\xed\xa0\x80"]}', "stop[0]"),  # the raw bytes json.loads lets through
    (b'{"prompt": "hi", "vllm_xargs": {"k": "\\ud83d"}}', "vllm_xargs.k"),
    (b'{"prompt": "hi", "logit_bias": {"\\ud800": 1}}', "logit_bias.\\ud800"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ude42"}]}]}',
     "messages[0].content[0].text"),
    (b'"\\ud800"', None),
])
def test_a_lone_surrogate_anywhere_gets_a_400_naming_where(raw, param):
    r = client().post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "surrogate" in r.json()["error"]["message"]


def test_a_surrogate_pair_is_text_and_passes():
    # an escaped pair decodes to one character (here U+1F642)
    r = client().post("/v1/completions", content=b'{"prompt": "hi \\ud83d\\ude42"}',
                      headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("so", ["x", True, [1], 3])
def test_structured_outputs_that_is_no_object_gets_a_400(so):
    # vLLM 0.32's validators call .get on it before its type is checked: a 500
    r = client().post("/v1/completions", json={"prompt": "hi", "structured_outputs": so})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text


@pytest.mark.parametrize("body", [{"prompt": "hi", "top_k": 2**64 + 1}, {"prompt": [1, 2**70]},
                                  {"prompt": "hi", "seed": -2**64}])
def test_integers_past_64_bits_get_a_400(body):
    # top_k of 2**64+1 reached vLLM's C code: a 500 with an empty message
    r = client().post("/v1/completions", json=body)
    assert r.status_code == 400 and "64-bit" in r.json()["error"]["message"], r.text
