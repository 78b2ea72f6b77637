"""The serve request gate on a tiny ASGI app, registered through vLLM's own `--middleware`
loader: the API key is checked first, oversized, deep or over-`n` bodies and bad media
parts (every shape vLLM reads, on every route) get a 4xx naming them and never reach the
app; everything else reaches it byte for byte."""

from __future__ import annotations

import base64
import json

import pytest

from support.image_samples import bad_requests, chat, good_url
from vllm_edge.serving import gate as gate_mod
from vllm_edge.serving.gate import GateConfig, RequestGate
from vllm_edge.serving.serve import GATE

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

MAX_IMAGES, MAX_BYTES, MAX_N, KEY = 2, 1 << 20, 4, "s3cret"


def echo_app():
    """An app that records what it received and echoes the body back."""
    seen: list[tuple[str, str, bytes]] = []

    async def app(scope, receive, send):
        body, more = b"", True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        seen.append((scope["method"], scope["path"], body))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream")]})
        await send({"type": "http.response.body", "body": body})

    return app, seen


def build(config: GateConfig | None, argv: list[str] = ()):
    """The echo app behind the gate, added from the import path serve.py passes to vLLM,
    with vLLM's own middleware (its API-key check included) around it."""
    from fastapi import FastAPI
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    gate_mod.configure(config)
    app, seen = echo_app()
    api = FastAPI()
    api.mount("/", app)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--middleware", GATE, *argv])
    init_entrypoints_middleware(args, api, supported_tasks=())
    client = TestClient(api)
    client.__enter__()  # builds the middleware stack now, while `config` is the configured one
    gate_mod.configure(None)
    return client, seen


def config(**kw) -> GateConfig:
    from vllm_edge.runtime.images import ImageLimits

    kw.setdefault("images", ImageLimits(max_bytes=MAX_BYTES, max_images=MAX_IMAGES))
    kw.setdefault("max_n", MAX_N)
    return GateConfig(**kw)


@pytest.fixture
def gated():
    client, seen = build(config())
    yield client, seen
    client.__exit__(None, None, None)


@pytest.mark.parametrize("case", list(bad_requests(MAX_IMAGES, MAX_BYTES)))
def test_bad_image_gets_4xx_naming_it(gated, case):
    client, seen = gated
    body, status, needle = bad_requests(MAX_IMAGES, MAX_BYTES)[case]
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"], err["message"]
    assert err["code"] == status and err["type"].endswith("Error")
    if case == "too_many_images":
        assert err["param"] == "messages"
    else:
        assert err["param"] == "messages[0].content[0]"
        assert err["message"].startswith("messages[0].content[0]: ")
    assert seen == [], "a refused request reached the app"


def test_good_image_reaches_the_app_unchanged(gated):
    client, seen = gated
    raw = json.dumps(chat(good_url(), good_url())).encode()  # at the limit of 2
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert seen == [("POST", "/v1/chat/completions", raw)] and r.content == raw


def test_chunked_body_is_put_back_together(gated):
    client, seen = gated
    raw = json.dumps(chat(good_url())).encode()
    pieces = [raw[i:i + 1000] for i in range(0, len(raw), 1000)]
    r = client.post("/v1/chat/completions", content=iter(pieces),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200 and len(pieces) > 1
    assert seen[0][2] == raw


def test_chunked_bad_body_is_refused(gated):
    client, seen = gated
    body, status, needle = bad_requests(MAX_IMAGES, MAX_BYTES)["truncated_png"]
    raw = json.dumps(body).encode()
    r = client.post("/v1/chat/completions", content=iter([raw[:100], raw[100:]]))
    assert r.status_code == status and needle in r.json()["error"]["message"]
    assert seen == []


@pytest.mark.parametrize("method, path, raw", [
    ("POST", "/v1/chat/completions", b'{"messages": ['),  # not JSON: vLLM's own error
    ("POST", "/v1/chat/completions", b'{"model": "m", "messages": "hi"}'),  # vLLM validates
    ("POST", "/v1/chat/completions", b'[1, 2]'),
    ("POST", "/v1/chat/completions",  # a tool schema may name a property image_url
     json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
                 "function": {"name": "f", "parameters": {"type": "object", "properties": {
                     "image_url": {"type": "string"}}}}}]}).encode()),
    ("POST", "/v1/audio/transcriptions", b"--x\r\nContent-Disposition: form-data\r\n\r\n@@"),
    ("GET", "/v1/models", b""),
])
def test_everything_else_passes_untouched(gated, method, path, raw):
    client, seen = gated
    r = client.request(method, path, content=raw)
    assert r.status_code == 200
    assert seen == [(method, path, raw)]


def test_text_only_chat_passes(gated):
    client, seen = gated
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert len(seen) == 1


@pytest.mark.parametrize("name", ["VLLM_EDGE_MAX_IMAGE_PIXELS", "VLLM_EDGE_MAX_BODY_BYTES"])
def test_bad_limit_in_the_environment_is_an_error(monkeypatch, name):
    monkeypatch.setenv(name, "-1")
    with pytest.raises(ValueError, match=name):
        RequestGate(echo_app()[0])


REMOTE = "http://example.com/cat.png"  # never fetched: only data URLs pass
ROUTES = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/chat/completions/render",
          "/v1/chat/completions/batch", "/tokenize", "/pooling", "/v1/embeddings", "/invocations",
          "/cohere/v2/chat"]
IMAGE_SHAPES = {
    "typed": lambda u: {"type": "image_url", "image_url": {"url": u}},
    "typed_with_uuid": lambda u: {"type": "text", "uuid": "u1", "image_url": {"url": u}},
    "typeless_dict": lambda u: {"image_url": {"url": u}},
    "typeless_string": lambda u: {"image_url": u},
    "responses_input_image": lambda u: {"type": "input_image", "image_url": u},
    "anthropic_url": lambda u: {"type": "image", "source": {"type": "url", "url": u}},
}


def body_for(route: str, part: dict) -> dict:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, part]}]
    if route == "/v1/responses":
        return {"model": "m", "input": msgs}
    if route == "/v1/chat/completions/batch":
        return {"model": "m", "messages": [msgs, msgs]}
    return {"model": "m", "messages": msgs}


@pytest.mark.parametrize("shape", sorted(IMAGE_SHAPES))
@pytest.mark.parametrize("route", ROUTES)
def test_every_image_shape_is_gated_on_every_route(gated, route, shape):
    client, seen = gated
    r = client.post(route, json=body_for(route, IMAGE_SHAPES[shape](REMOTE)))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "only data:image" in err["message"] and err["param"].endswith("content[1]"), err
    assert seen == []


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_good_images_in_each_shape_pass(gated, route):
    client, seen = gated
    url = good_url()
    mime, data = url[5:].split(";base64,")
    for part in (IMAGE_SHAPES["typeless_dict"](url), IMAGE_SHAPES["responses_input_image"](url),
                 {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}):
        r = client.post(route, json=body_for(route, part))
        assert r.status_code == 200, r.text
    assert len(seen) == 3


def test_anthropic_base64_image_is_decoded_and_checked(gated):
    client, seen = gated
    data = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()
    part = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    r = client.post("/v1/messages", json=body_for("/v1/messages", part))
    assert r.status_code in (400, 415) and r.json()["error"]["param"] == "messages[0].content[1]"
    assert seen == []


@pytest.mark.parametrize("part, kind", [
    ({"type": "audio_url", "audio_url": {"url": REMOTE}}, "audio_url"),
    ({"audio_url": REMOTE}, "audio_url"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "input_audio"),
    ({"type": "video_url", "video_url": {"url": REMOTE}}, "video_url"),
    ({"video_url": {"url": REMOTE}}, "video_url"),
    ({"type": "image_embeds", "image_embeds": "AAAA"}, "image_embeds"),
    ({"image_embeds": "AAAA"}, "image_embeds"),
    ({"type": "input_file", "file_id": "f1"}, "input_file"),
    ({"type": "input_image", "file_id": "f1"}, "file_id"),
])
def test_other_media_are_refused(gated, part, kind):
    client, seen = gated
    r = client.post("/v1/chat/completions", json=body_for("/v1/chat/completions", part))
    assert r.status_code == 400 and f"{kind} parts are not accepted" in r.json()["error"]["message"]
    assert seen == []


def test_prompt_embeds_are_refused(gated):
    client, seen = gated
    r = client.post("/v1/completions", json={"model": "m", "prompt_embeds": "AAAA"})
    assert r.status_code == 400 and "prompt_embeds" in r.json()["error"]["message"]
    assert seen == []


def test_a_text_model_refuses_any_image():
    client, seen = build(config(accepts_images=False, model="smollm2-135m"))
    with client:
        r = client.post("/v1/chat/completions", json=chat(good_url()))
    assert r.status_code == 400 and "takes no images" in r.json()["error"]["message"]
    assert seen == []


def test_too_many_images_counted_across_shapes(gated):
    client, seen = gated
    url = good_url()
    content = [IMAGE_SHAPES["typed"](url), IMAGE_SHAPES["typeless_string"](url),
               IMAGE_SHAPES["responses_input_image"](url)]
    r = client.post("/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": content}]})
    assert r.status_code == 400 and "3 images" in r.json()["error"]["message"]
    assert seen == []


def test_body_over_the_cap_is_refused_before_it_is_read():
    client, seen = build(config(max_body_bytes=10_000))
    with client:
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 20_000}]}).encode()
        r = client.post("/v1/chat/completions", content=big,
                        headers={"content-type": "application/json"})
        assert r.status_code == 413 and "limit of 10000 bytes" in r.json()["error"]["message"]
        # no Content-Length: counted as it arrives
        r = client.post("/v1/chat/completions", content=iter([big[:6000], big[6000:]]))
        assert r.status_code == 413 and "body of over " in r.json()["error"]["message"]
        ok = json.dumps({"messages": [{"role": "user", "content": "x" * 9000}]}).encode()
        assert client.post("/v1/chat/completions", content=ok).status_code == 200
    assert len(seen) == 1


def test_default_cap_sits_above_one_image_at_the_limit():
    from vllm_edge.runtime.images import ImageLimits

    lim = ImageLimits(max_bytes=20 << 20)
    assert GateConfig(images=lim).body_cap == (4 << 20) - (-(20 << 20) * 4 // 3)
    assert GateConfig(images=lim, accepts_images=False).body_cap == 4 << 20
    assert GateConfig(images=lim, max_body_bytes=123).body_cap == 123


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deep_json_gets_a_400(gated, depth):
    client, seen = gated
    raw = b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested deeper than 64" in r.json()["error"]["message"]
    assert seen == []


def test_n_over_max_num_seqs_gets_a_400(gated):
    client, seen = gated
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/v1/chat/completions", json={**body, "n": MAX_N + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert f"at most {MAX_N}" in r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={**body, "n": MAX_N}).status_code == 200
    assert len(seen) == 1


@pytest.fixture
def keyed():
    client, seen = build(config(api_keys=(KEY,), max_body_bytes=10_000), ["--api-key", KEY])
    yield client, seen
    client.__exit__(None, None, None)


def test_the_api_key_is_checked_before_anything_else(keyed):
    client, seen = keyed
    bad = body_for("/v1/chat/completions", IMAGE_SHAPES["typed"](REMOTE))
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * 50_000}]}).encode()
    for kwargs in ({"json": bad}, {"content": huge}, {"content": b"[" * 100_000}):
        r = client.post("/v1/chat/completions", **kwargs)
        assert r.status_code == 401, r.text  # not 400/413: no key, no checks, no reading
        r = client.post("/v1/chat/completions", headers={"Authorization": "Bearer wrong"}, **kwargs)
        assert r.status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.post("/v1/chat/completions", json=bad, headers=auth).status_code == 400
    assert client.post("/v1/chat/completions", content=huge, headers=auth).status_code == 413
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=good, headers=auth).status_code == 200
    assert client.get("/health").status_code == 200  # vLLM leaves /health open
    assert [(m, p) for m, p, _ in seen] == [("POST", "/v1/chat/completions"), ("GET", "/health")]


def test_the_key_does_not_show_in_the_gate_repr():
    assert KEY not in repr(RequestGate(echo_app()[0], config(api_keys=(KEY,))))
