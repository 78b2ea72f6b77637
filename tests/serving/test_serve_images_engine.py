"""`vllm-edge serve` on the embedded VLM (smolvlm-135m, eager), one real server for the
module, started with an API key: a data-URL image gets an answer; every bad image, in any
part shape and on any route, gets a 4xx naming the problem (from the request gate, before
vLLM sees it), a client without the key gets a 401 first, and the server keeps serving.

The server runs with VLLM_EDGE_MAX_IMAGES=2 and VLLM_EDGE_MAX_IMAGE_BYTES=1 MiB, so the
limits are shown to come from the environment and to reach vLLM's limit_mm_per_prompt.
"""

from __future__ import annotations

import os
import time

import pytest

from support.image_samples import bad_requests, chat, good_url

pytestmark = pytest.mark.slow
httpx = pytest.importorskip("httpx")

TIMEOUT = 900  # the host is shared: an image prefill at nice 19 can take minutes
MAX_IMAGES, MAX_BYTES, KEY = 2, 1 << 20, "edge-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BAD = bad_requests(MAX_IMAGES, MAX_BYTES)


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory, monkeypatch_module):
    from vllm_edge.bench import soak

    monkeypatch_module.setenv("VLLM_EDGE_MAX_IMAGES", str(MAX_IMAGES))
    monkeypatch_module.setenv("VLLM_EDGE_MAX_IMAGE_BYTES", str(MAX_BYTES))
    monkeypatch_module.delenv("VLLM_EDGE_MAX_IMAGE_PIXELS", raising=False)
    port = soak.free_port()
    log = tmp_path_factory.mktemp("serve_vlm") / "server.log"
    proc = soak.start_server(["smolvlm-135m", "--enforce-eager", "--api-key", KEY], port, log)
    yield {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log}
    assert soak.stop_server(proc) is not None, "the server did not stop"


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _post(server, body, route="/v1/chat/completions", headers=AUTH, **kw):
    return httpx.post(server["url"] + route, timeout=TIMEOUT, headers=headers,
                      **({"json": body} if body is not None else {}), **kw)


def _alive(server):
    assert server["proc"].poll() is None, "the server process died"
    assert httpx.get(server["url"] + "/health", timeout=60).status_code == 200


def _answers(server, body):
    r = _post(server, body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["message"]["content"].strip()
    assert out["usage"]["prompt_tokens"] > 67  # the image is in the prompt (67 tokens each)
    return out


def test_gate_and_limit_are_on(vlm_server):
    text = vlm_server["log"].read_text()
    assert f"limit_mm_per_prompt={{image: {MAX_IMAGES}}}" in text
    assert "request gate: vllm_edge.serving.gate.RequestGate" in text
    assert "WARNING" not in text.split("listening on")[0]  # loopback: no open-server warning


def test_good_image_is_answered(vlm_server):
    _answers(vlm_server, chat(good_url()))


@pytest.mark.parametrize("case", list(BAD))
def test_bad_image_gets_4xx_naming_it(vlm_server, case):
    body, status, needle = BAD[case]
    t = time.time()
    r = _post(vlm_server, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"], err["message"]
    assert err["code"] == status and err["param"]
    assert time.time() - t < 120, "the server stalled on a bad image"
    _alive(vlm_server)


def test_remote_url_is_refused_not_fetched(vlm_server):
    # vLLM alone tries to fetch it and answers 500 when it cannot
    r = _post(vlm_server, chat("http://127.0.0.1:9/x.png"))
    assert r.status_code == 400, r.text
    assert "no remote fetches" in r.json()["error"]["message"]


def test_the_gate_holds_the_image_limit_on_the_responses_route(vlm_server):
    content = [*({"type": "input_image", "image_url": good_url()} for _ in range(MAX_IMAGES + 1)),
               {"type": "input_text", "text": "What is in these pictures?"}]
    r = _post(vlm_server, {"model": "smolvlm-135m", "max_output_tokens": 8,
                           "input": [{"role": "user", "content": content}]}, route="/v1/responses")
    assert r.status_code == 400, r.text
    assert f"the limit is {MAX_IMAGES}" in r.json()["error"]["message"]


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"model": "smolvlm-135m", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"image_url": "http://127.0.0.1:9/x.png"},
                                     {"type": "text", "text": "what is it?"}]}]}),
    ("/v1/responses", {"model": "smolvlm-135m", "max_output_tokens": 4, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "http://127.0.0.1:9/x.png"},
                                     {"type": "input_text", "text": "what is it?"}]}]}),
    ("/v1/messages", {"model": "smolvlm-135m", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {
            "type": "url", "url": "http://127.0.0.1:9/x.png"}}, {"type": "text", "text": "hi"}]}]}),
])
def test_other_part_shapes_and_routes_are_gated(vlm_server, route, body):
    r = _post(vlm_server, body, route=route)
    assert r.status_code == 400, r.text
    assert "no remote fetches" in r.json()["error"]["message"]


def test_no_key_gets_401_before_any_check(vlm_server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert _post(vlm_server, BAD["truncated_png"][0], headers=headers).status_code == 401
        r = _post(vlm_server, None, headers=headers, content=b"[" * 100_000)
        assert r.status_code == 401
    assert httpx.get(vlm_server["url"] + "/health", timeout=60).status_code == 200


def test_deep_json_oversized_body_and_n_get_4xx(vlm_server):
    r = _post(vlm_server, None, content=b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
              headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"], r.text
    big = b"x" * ((4 << 20) + 2 * MAX_BYTES)  # over text room + one base64 image
    r = _post(vlm_server, None, content=big, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 413, r.text
    r = _post(vlm_server, {"model": "smolvlm-135m", "n": 64, "max_tokens": 2,
                           "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


def test_still_serves_after_the_bad_images(vlm_server):
    """Runs last (pytest keeps file order): every bad case above has been sent."""
    out = _answers(vlm_server, chat(good_url(), good_url()))  # at the limit of 2
    assert out["usage"]["prompt_tokens"] > 2 * 67
    assert os.environ.get("VLLM_EDGE_MAX_IMAGES") == str(MAX_IMAGES)
