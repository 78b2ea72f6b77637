"""A seeded fuzz of the request gate's body check (serving.gate.check_body), the code every
POST to `serve` goes through: request bodies built from the shapes vLLM's routes take (chat,
Responses, Anthropic, batch, completions), with media parts of every shape in random places,
random values of the wrong type, random nesting, and the bytes of the body cut or changed.

Each body either passes or raises GateError / ImageInputError with status 400, 413 or 415;
never another exception, never past a deadline."""

from __future__ import annotations

import json
import random
import traceback
from collections import Counter

from support import fuzz
from support.image_samples import good_url
from vllm_edge.runtime.images import ImageInputError, ImageLimits
from vllm_edge.serving.gate import GateConfig, GateError, check_body

SEED = 4242
CASES = 3000
CONFIGS = [GateConfig(images=ImageLimits(max_bytes=200_000, max_images=2), max_n=4),
           GateConfig(images=ImageLimits(max_bytes=200_000), accepts_images=False, max_n=1)]
PART_KEYS = ["image_url", "input_image", "image", "audio_url", "input_audio", "video_url",
             "image_embeds", "prompt_embeds", "image_pil", "input_file", "text", "input_text",
             None, 7]


def _value(rng: random.Random, depth: int = 0):
    pick = rng.randrange(9 if depth < 4 else 5)
    if pick == 0:
        return rng.choice([None, True, False, 0, -1, 2**70, 1.5, float("1e308")])
    if pick == 1:
        return rng.choice(["", "x", "data:", "data:image/png;base64,", "http://127.0.0.1:9/a.png",
                           "/etc/passwd", good_url(), "data:image/png;base64,@@@",
                           "data:image/tiff;base64,AAAA", "data:text/plain;base64,aGk=",
                           "data:image/png;base64," + "A" * 300_000])
    if pick in (2, 3, 4):
        return rng.choice(["hi", 3, None, []])
    if pick in (5, 6):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["url", "type", "source", "data", "media_type", "uuid", "file_id",
                        *[k for k in PART_KEYS if isinstance(k, str)]]): _value(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def _part(rng: random.Random) -> dict:
    kind = rng.choice(PART_KEYS)
    part: dict = {}
    if rng.random() < 0.8:
        part["type"] = kind
    if isinstance(kind, str) and rng.random() < 0.8:
        part[kind] = rng.choice([_value(rng), {"url": _value(rng)}, good_url()])
    if kind == "image" and rng.random() < 0.7:
        part["source"] = rng.choice([{"type": "base64", "media_type": "image/png",
                                      "data": good_url().split(",", 1)[1]},
                                     {"type": "url", "url": _value(rng)}, _value(rng)])
    if rng.random() < 0.2:
        part["uuid"] = "u"
    return part


def _body(rng: random.Random):
    msgs = [{"role": rng.choice(["user", "system", "assistant", 5]),
             "content": rng.choice([[_part(rng) for _ in range(rng.randrange(4))], "hi", None,
                                    _value(rng)])} for _ in range(rng.randrange(4))]
    shape = rng.randrange(6)
    body = ({"messages": msgs} if shape < 2 else {"input": msgs} if shape == 2
            else {"messages": [msgs, msgs]} if shape == 3 else {"prompt": _value(rng)}
            if shape == 4 else _value(rng))
    if isinstance(body, dict) and rng.random() < 0.3:
        body["n"] = rng.choice([1, 4, 5, 2**40, "5", None, True])
    if isinstance(body, dict) and rng.random() < 0.2:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"image_url": {"type": "string"}}}}}]
    return body


def _bytes(rng: random.Random, body) -> bytes:
    raw = json.dumps(body).encode()
    r = rng.random()
    if r > 0.9:  # nested around the limit and far past it
        depth = rng.choice([60, 70, 5000])
        return b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"
    if r < 0.1 and raw:
        return raw[:rng.randrange(len(raw))]
    if r < 0.2 and raw:
        b = bytearray(raw)
        for _ in range(rng.randrange(1, 5)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if r < 0.22:
        return b"[" * 200_000
    return raw


def test_fuzzed_bodies_pass_or_get_a_clean_4xx():
    rng = random.Random(SEED)
    outcomes: Counter = Counter()
    bad = []
    with fuzz.memory_cap():
        for i in range(CASES):
            config = CONFIGS[i % len(CONFIGS)]
            raw = _bytes(rng, _body(rng))
            try:
                with fuzz.deadline(10.0, f"case {i}"):
                    check_body(raw, config)
                outcomes["passed"] += 1
            except (GateError, ImageInputError) as exc:
                if exc.status not in (400, 413, 415) or not str(exc):
                    bad.append((i, raw[:200], repr(exc)))
                outcomes[exc.status] += 1
            except Exception:
                bad.append((i, raw[:200], traceback.format_exc(limit=3)))
    assert not bad, bad[:5]
    # the mix reached every answer: a fuzz that only passes (or only refuses) tests nothing
    assert outcomes["passed"] > 100 and outcomes[400] > 100 and outcomes[415] + outcomes[413] > 0, outcomes
