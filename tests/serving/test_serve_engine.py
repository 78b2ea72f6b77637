"""`vllm-edge serve` against one real server (default model, eager), shared by every test.

The server runs as a user would start it, in its own session; at the end its whole
process group is stopped so the memory goes back. Time limits are generous: the host
is shared, and a stall means no answer at all, not a slow one.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from support.cli_runner import run_cli

pytestmark = pytest.mark.slow
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

TIMEOUT = 600
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="session")
def server(default_model_dir, tmp_path_factory):
    from vllm_edge.bench import soak

    port = soak.free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    # --enable-log-requests: vLLM then logs "Request <id> aborted." (the disconnect test reads it)
    proc = soak.start_server(["default", "--enforce-eager", "--", "--enable-log-requests"], port, log)
    yield {"url": f"http://127.0.0.1:{port}", "port": port, "pid": proc.pid, "log": log, "proc": proc}
    rc = soak.stop_server(proc)
    assert rc is not None, "the server did not stop"


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", timeout=TIMEOUT)


def _post(server, body, **kw):
    return httpx.post(server["url"] + "/v1/chat/completions", timeout=TIMEOUT, **kw,
                      **({"json": body} if body is not None else {}))


def _alive(server):
    assert server["proc"].poll() is None, "the server process died"
    assert httpx.get(server["url"] + "/health", timeout=60).status_code == 200


def test_prints_what_it_chose(server):
    text = server["log"].read_text()
    for needle in ("weight path: cpu_int4", "kv_cache_memory_bytes=", "OMP_NUM_THREADS=",
                   "VLLM_ENABLE_V1_MULTIPROCESSING=0", "tool calls: hermes", "tool strict level"):
        assert needle in text, needle


def test_two_processes(server):
    """API server + one engine core that runs the model: no third worker process."""
    import psutil

    from vllm_edge.common.procmem import process_tree

    names = [psutil.Process(p).cmdline() for p in process_tree(server["pid"])]
    python = [c for c in names if c and "resource_tracker" not in " ".join(c)]
    assert len(python) == 2, names
    assert "Loading weights took" in server["log"].read_text()


def test_health_and_models(server):
    assert httpx.get(server["url"] + "/health", timeout=60).status_code == 200
    models = httpx.get(server["url"] + "/v1/models", timeout=60).json()
    ids = [m["id"] for m in models["data"]]
    assert ids == ["smollm2-135m", "default"]
    assert models["data"][0]["max_model_len"] == 2048
    assert models["data"][0]["root"].endswith("smollm2-135m-cpu_int4-g32-repack")


def test_openai_client_chat(client):
    r = client.chat.completions.create(
        model="default", temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.model == "smollm2-135m"
    assert r.choices[0].message.content.strip()
    assert r.usage.completion_tokens > 0


def test_openai_client_streams(client):
    stream = client.chat.completions.create(
        model="smollm2-135m", temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Name three colours."}])
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            pieces.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(pieces).strip()
    assert finish in ("stop", "length")
    assert usage.completion_tokens == 12 or finish == "stop"


def test_completions(client):
    r = client.completions.create(model="default", prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.choices[0].text.strip()


# --- bad input: a 4xx with a message, and the server keeps serving ---------------------

BAD = {
    "invalid_json": (b'{"model": "default", "messages": [', "JSON"),
    "unknown_model": ({"model": "no-such-model", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}, "no-such-model"),
    "max_tokens_beyond_context": ({"model": "default", "max_tokens": 5000,
                                   "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    "tools_not_a_list": ({"model": "default", "max_tokens": 4, "tools": "get_weather",
                          "messages": [{"role": "user", "content": "hi"}]}, "tools"),
    "tool_without_name": ({"model": "default", "max_tokens": 4,
                           "tools": [{"type": "function", "function": {"parameters": {}}}],
                           "messages": [{"role": "user", "content": "hi"}]}, "name"),
    "tool_parameters_not_object": ({"model": "default", "max_tokens": 4,
                                    "tools": [{"type": "function", "function": {
                                        "name": "f", "parameters": "x"}}],
                                    "messages": [{"role": "user", "content": "hi"}]}, "parameters"),
    "tool_choice_names_no_tool": ({"model": "default", "max_tokens": 4, "tools": WEATHER,
                                   "tool_choice": {"type": "function", "function": {"name": "g"}},
                                   "messages": [{"role": "user", "content": "hi"}]}, "tool_choice"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_4xx_with_message(server, case):
    body, needle = BAD[case]
    t = time.time()
    if isinstance(body, bytes):
        r = _post(server, None, content=body, headers={"content-type": "application/json"})
    else:
        r = _post(server, body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    message = r.json()["error"]["message"]
    assert needle in message, message
    assert time.time() - t < 120, "the server stalled on bad input"
    _alive(server)


def test_prompt_longer_than_max_model_len(server):
    from vllm_edge.bench.prompts import long_document

    text = long_document(("datamodel",), min_words=2048 + 64)  # words <= tokens
    r = _post(server, {"model": "default", "max_tokens": 4,
                       "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 400, r.text
    assert "maximum context length is 2048" in r.json()["error"]["message"]
    _alive(server)


# --- tool calls ---------------------------------------------------------------------

def _weather_call(r):
    calls = r.choices[0].message.tool_calls
    assert calls, r.choices[0].message
    assert calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args, dict) and isinstance(args.get("city"), str), args
    return args


def test_tool_choice_required(client):
    r = client.chat.completions.create(model="default", messages=ASK_WEATHER, tools=WEATHER,
                                       tool_choice="required", max_tokens=64, temperature=0)
    _weather_call(r)
    assert r.choices[0].finish_reason == "tool_calls"


def test_tool_choice_named(client):
    r = client.chat.completions.create(
        model="default", messages=ASK_WEATHER, tools=WEATHER, max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    _weather_call(r)


def test_tool_choice_auto_reported(client):
    """A 135M model decides for itself under `auto`; either answer is valid, and a call it
    does make must parse. What it did goes into the test log."""
    r = client.chat.completions.create(model="default", messages=ASK_WEATHER, tools=WEATHER,
                                       tool_choice="auto", max_tokens=64, temperature=0)
    msg = r.choices[0].message
    if msg.tool_calls:
        print("tool_choice=auto: the model called", [c.function for c in msg.tool_calls])
        _weather_call(r)
    else:
        print("tool_choice=auto: the model answered in prose:", repr(msg.content))
        assert msg.content.strip()


def test_streamed_tool_call(client):
    stream = client.chat.completions.create(model="default", messages=ASK_WEATHER, tools=WEATHER,
                                            tool_choice="required", max_tokens=64, temperature=0,
                                            stream=True)
    name, args = None, ""
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    assert name == "get_weather"
    assert isinstance(json.loads(args).get("city"), str)


# --- a client that leaves mid-stream: the engine stops generating for it --------------

def _metrics(server) -> dict:
    text = httpx.get(server["url"] + "/metrics", timeout=60).text

    def total(name):
        return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))

    return {"generated": total("vllm:generation_tokens_total"),
            "running": total("vllm:num_requests_running")}


def test_disconnect_aborts_the_request_in_the_engine(server):
    before = _metrics(server)
    assert before["running"] == 0
    body = {"model": "default", "max_tokens": 1500, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    request_id, seen = None, 0
    with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", server["url"] + "/v1/chat/completions",
                                                      json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                obj = json.loads(line[6:])
                request_id = obj["id"]
                seen += sum(1 for ch in obj["choices"] if ch["delta"].get("content"))
                if seen >= 3:
                    break  # leaving the block closes the connection
    # 1500 tokens with ignore_eos take minutes here: if the request lived on, "running"
    # would stay 1 and the generated-token counter would keep climbing
    deadline = time.time() + 60
    while _metrics(server)["running"] and time.time() < deadline:
        time.sleep(0.5)
    a = _metrics(server)
    time.sleep(5)
    b = _metrics(server)
    assert a["running"] == 0 and b["running"] == 0
    assert b["generated"] == a["generated"], "the engine kept generating after the disconnect"
    assert b["generated"] - before["generated"] < 100
    # and vLLM says so in its log
    deadline = time.time() + 30
    while time.time() < deadline and not re.search(rf"Request {re.escape(request_id)}\S* aborted",
                                                    server["log"].read_text()):
        time.sleep(0.5)
    assert re.search(rf"Request {re.escape(request_id)}\S* aborted", server["log"].read_text())
    _alive(server)


# --- a second server on the same port -------------------------------------------------

def test_busy_port_fails_fast_and_clearly(server):
    t = time.time()
    proc = run_cli("serve", "--port", str(server["port"]), timeout=300)
    took = time.time() - t
    assert proc.returncode == 2
    assert f"port {server['port']} on 127.0.0.1 is already in use" in proc.stderr
    assert str(server["pid"]) in proc.stderr  # names the process holding it
    assert "Loading weights" not in proc.stdout + proc.stderr  # failed before any engine work
    print(f"busy port reported after {took:.1f} s")
    _alive(server)


# --- the short soak: 8 clients, 60 s ---------------------------------------------------

def test_short_soak(server, tmp_path):
    from vllm_edge.bench import soak

    result = soak.run_against(server["url"], server["pid"], duration_s=30, clients=8,
                              warmup_s=10, sample_s=1.0)
    print(json.dumps({k: result[k] for k in ("requests", "by_class", "ttft_s", "tpot_s",
                                              "rss_anon")}, indent=1))
    assert result["requests"] >= 8
    assert result["http_5xx"] == 0
    assert result["errors"] == {}, result["errors_sample"]
    assert result["health_after"] == 200
    assert len(result["rss_anon_samples"]) >= 15  # memory numbers are reported, not asserted
    _alive(server)


# --- the agent suite against this server ----------------------------------------------

def test_agent_client_maps_the_context_400_to_overflow(server):
    from vllm_edge.agent.client import openai_chat
    from vllm_edge.bench.engines.chat import ContextOverflow
    from vllm_edge.bench.prompts import long_document
    from vllm_edge.common.phone_tools import TOOLS

    chat = openai_chat(server["url"] + "/v1", "default", max_tokens=8)
    with pytest.raises(ContextOverflow, match="maximum context length"):
        chat([{"role": "user", "content": long_document(("datamodel",), min_words=2048 + 64)}], TOOLS)
    _alive(server)


def test_agent_run_records_the_served_build(server, tmp_path):
    out = tmp_path / "agent.json"
    r = run_cli("agent", "run", "--base-url", server["url"] + "/v1", "--model", "default",
                "--tasks", "wifi_on", "--variants", "base", "--max-steps", "1", "--max-tokens", "16",
                "--out", str(out), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["summary"]["runs"] == 1 and len(data["runs"][0]["actions"]) <= 1
    served = data["provenance"]["server_model"]
    assert served["root"].endswith("smollm2-135m-cpu_int4-g32-repack") and served["max_model_len"] == 2048
    assert "fewer than 3 runs" in r.stdout + r.stderr
