"""`bench soak --hostile` without an engine: every hostile request class gets the status the
soak expects from the real gate (the default model's tokenizer compiles the slow schema), and
the soak's RssAnon summary keeps the schema compiler's sawtooth apart from the server."""

from __future__ import annotations

import random

import pytest

from vllm_edge.bench import soak
from vllm_edge.serving.gate import GateConfig, RequestGate

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

KEY = "soak-key"


async def tiny_app(scope, receive, send):
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def client(default_model_dir):
    # as serve configures it for the default model (text only), with a short compile budget
    g = RequestGate(tiny_app, GateConfig(api_keys=(KEY,), max_n=4, accepts_images=False,
                                         tokenizer=str(default_model_dir), schema_compile_s=2.0))
    yield TestClient(g, headers={"Authorization": f"Bearer {KEY}"})
    g.compiler.close()


@pytest.mark.parametrize("kind", sorted(soak.HOSTILE_MIX))
def test_each_hostile_class_gets_the_status_the_soak_expects(client, kind):
    want, _ = soak.HOSTILE_EXPECTED[kind]
    for seed in range(2):  # the classes draw values (n, maxLength) from the client's rng
        content, headers = soak.hostile_request(kind, random.Random(seed))
        r = client.post("/v1/chat/completions", content=content,
                        headers={"Content-Type": "application/json", **headers})
        assert r.status_code == want, (kind, r.text[:300])


def test_every_hostile_class_has_a_request_and_an_expectation():
    assert set(soak.HOSTILE_MIX) == set(soak.HOSTILE_EXPECTED)
    with pytest.raises(ValueError):
        soak.hostile_request("no_such_class", random.Random(0))


def _samples(server_mb, worker_mb):
    return [(1000.0 + 2 * i, s + w, 4) for i, (s, w) in enumerate(zip(server_mb, worker_mb))]


def test_the_flatness_check_leaves_out_the_compile_worker_and_keeps_both():
    # a flat server beside a worker that is killed and started again: the tree is a sawtooth
    server = [1000.0] * 40
    worker = [300.0 if i % 4 else 0.0 for i in range(40)]
    out = soak._summary([], _samples(server, worker), 1000.0, 10.0, 80.0,
                        worker_mb=worker, worker_starts=10)
    rss = out["rss_anon"]
    assert rss["flat_within_5pct"] is False  # the whole tree
    assert rss["without_compile_worker"]["flat_within_5pct"] is True
    assert rss["without_compile_worker"]["slope_mb_per_min"] == 0.0
    assert rss["compile_worker"] == {"starts": 10, "samples_present": 30, "max_mb": 300.0,
                                     "median_mb": 300.0}
    assert out["passed"] is True and len(out["rss_anon_compile_worker_samples"]) == 40


def test_a_server_that_grows_still_fails_with_the_worker_left_out():
    server = [1000.0 + 5 * i for i in range(40)]  # +150 MB/min
    out = soak._summary([], _samples(server, [0.0] * 40), 1000.0, 10.0, 80.0,
                        worker_mb=[0.0] * 40, worker_starts=0)
    assert out["rss_anon"]["without_compile_worker"]["slope_mb_per_min"] == pytest.approx(150.0)
    assert out["passed"] is False
