"""The serve image gate on a tiny ASGI app, registered through vLLM's own `--middleware`
loader: bad images get a 4xx naming them and never reach the app; everything else reaches
it byte for byte."""

from __future__ import annotations

import json

import pytest

from support.image_samples import bad_requests, chat, good_url
from vllm_edge.serving.image_gate import ImageGate
from vllm_edge.serving.serve import IMAGE_GATE

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

MAX_IMAGES, MAX_BYTES = 2, 1 << 20


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


@pytest.fixture
def gated(monkeypatch):
    """The echo app behind the gate, added from the import path serve.py passes to vLLM."""
    from fastapi import FastAPI
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGES", str(MAX_IMAGES))
    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGE_BYTES", str(MAX_BYTES))
    monkeypatch.delenv("VLLM_EDGE_MAX_IMAGE_PIXELS", raising=False)
    app, seen = echo_app()
    api = FastAPI()
    api.mount("/", app)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--middleware", IMAGE_GATE])
    init_entrypoints_middleware(args, api, supported_tasks=())
    return TestClient(api), seen


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
    ("POST", "/v1/completions", json.dumps(chat("data:image/png;base64,@@")).encode()),
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


def test_bad_limit_in_the_environment_is_an_error(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGE_PIXELS", "0")
    with pytest.raises(ValueError, match="VLLM_EDGE_MAX_IMAGE_PIXELS"):
        ImageGate(echo_app()[0])
