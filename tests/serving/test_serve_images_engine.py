"""`vllm-edge serve` on the embedded VLM (smolvlm-135m, eager), one real server for the
module: a data-URL image gets an answer; every bad image gets a 4xx naming the problem
(from the image gate, before vLLM sees it), and the server keeps serving.

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
MAX_IMAGES, MAX_BYTES = 2, 1 << 20
BAD = bad_requests(MAX_IMAGES, MAX_BYTES)


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory, monkeypatch_module):
    from vllm_edge.bench import soak

    monkeypatch_module.setenv("VLLM_EDGE_MAX_IMAGES", str(MAX_IMAGES))
    monkeypatch_module.setenv("VLLM_EDGE_MAX_IMAGE_BYTES", str(MAX_BYTES))
    monkeypatch_module.delenv("VLLM_EDGE_MAX_IMAGE_PIXELS", raising=False)
    port = soak.free_port()
    log = tmp_path_factory.mktemp("serve_vlm") / "server.log"
    proc = soak.start_server(["smolvlm-135m", "--enforce-eager"], port, log)
    yield {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log}
    assert soak.stop_server(proc) is not None, "the server did not stop"


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _post(server, body):
    return httpx.post(server["url"] + "/v1/chat/completions", json=body, timeout=TIMEOUT)


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
    assert "image gate: vllm_edge.serving.image_gate.ImageGate" in text


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


def test_vllm_itself_holds_the_image_limit(vlm_server):
    """limit_mm_per_prompt reached vLLM: its Responses route (which the gate does not look
    at) refuses one image over VLLM_EDGE_MAX_IMAGES with vLLM's own message."""
    content = [*({"type": "input_image", "image_url": good_url()} for _ in range(MAX_IMAGES + 1)),
               {"type": "input_text", "text": "What is in these pictures?"}]
    r = httpx.post(vlm_server["url"] + "/v1/responses", timeout=TIMEOUT, json={
        "model": "smolvlm-135m", "max_output_tokens": 8,
        "input": [{"role": "user", "content": content}]})
    assert r.status_code == 400, r.text
    assert f"At most {MAX_IMAGES} image(s)" in r.json()["error"]["message"]


def test_still_serves_after_the_bad_images(vlm_server):
    """Runs last (pytest keeps file order): every bad case above has been sent."""
    out = _answers(vlm_server, chat(good_url(), good_url()))  # at the limit of 2
    assert out["usage"]["prompt_tokens"] > 2 * 67
    assert os.environ.get("VLLM_EDGE_MAX_IMAGES") == str(MAX_IMAGES)
