"""The body fuzzer of `vllm-edge bench fuzz`: seeded (same seed, same bodies), varied (every
route, bodies that pass and bodies that are refused), and a seeded sample of 200 through the
gate, as the ASGI middleware vLLM loads with a tiny app standing for vLLM, answers none with a
5xx."""

from __future__ import annotations

import asyncio

import httpx

from vllm_edge.bench import fuzz_serve
from vllm_edge.serving.gate import GateConfig, RequestGate

KEY = "k"


async def tiny_app(scope, receive, send):
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def test_the_same_seed_gives_the_same_bodies():
    assert fuzz_serve.cases(7, 50) == fuzz_serve.cases(7, 50)
    assert fuzz_serve.cases(7, 50) != fuzz_serve.cases(8, 50)


def test_a_seeded_sample_through_the_gate_gets_no_5xx():
    items = fuzz_serve.cases(0, 200)
    assert {r for r, _, _ in items} == set(fuzz_serve.ROUTES)
    gate = RequestGate(tiny_app, GateConfig(api_keys=(KEY,), max_n=4))
    statuses, by_route, bad = asyncio.run(fuzz_serve.send_all(
        "http://127.0.0.1", items, api_key=KEY, transport=httpx.ASGITransport(app=gate)))
    assert not bad, bad[:3]
    assert sum(statuses.values()) == 200
    # the mix reaches both answers: a fuzz whose bodies all pass (or all fail) tests nothing
    assert statuses[200] > 50 and statuses[400] > 10, statuses
