"""`vllm-edge bench fuzz`: seeded, mutated request bodies sent to a real `vllm-edge serve`
through its gate, counted by HTTP status. The claim it checks: no body a client can send makes
the server answer 5xx.

Bodies start from valid requests of the chat, completions, embeddings and tokenize routes
(``max_tokens`` at most 4, so a body that passes costs little) and are mutated: fields of the
wrong type, huge, negative and non-finite numbers (``NaN`` and ``Infinity`` as JSON tokens),
fields dropped, unknown fields, deep nesting, odd unicode (lone surrogates, NUL, bidi marks),
the bytes cut or flipped, and random bytes. The same seed gives the same bodies.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize")
WEIRD_STRINGS = ["", " ", "\x00", "\ud800", "\u202e\u2066x", "é" * 50, "🙂" * 20, "\\u0000",
                 "null", "{}", "%s%n", "a" * 5000, "\r\n\r\n", "default"]
WEIRD_NUMBERS = [0, -1, 1, 2**31, 2**63, 2**64 + 1, -2**63, 10**400, 1e308, -1e308, 0.5, -0.0,
                 1e-320, float("nan"), float("inf"), float("-inf")]


def _weird(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(8 if depth < 3 else 4)
    if pick == 0:
        return rng.choice(WEIRD_NUMBERS)
    if pick == 1:
        return rng.choice(WEIRD_STRINGS)
    if pick == 2:
        return rng.choice([None, True, False])
    if pick == 3:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 20)))
    if pick in (4, 5):
        return [_weird(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["role", "content", "type", "text", "x", "n", "model"]): _weird(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def base_body(rng: random.Random, route: str, model: str) -> dict:
    text = rng.choice(["hi", "What is 2+2?", "Name a colour.", "ok"])
    if route == "/v1/chat/completions":
        body: dict = {"model": model, "messages": [{"role": "user", "content": text}],
                      "max_tokens": rng.randint(1, 4)}
        if rng.random() < 0.15:
            body["response_format"] = {"type": "json_object"}
        if rng.random() < 0.1:
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"q": {"type": "string"}}}}}]
            body["tool_choice"] = rng.choice(["auto", "required", "none"])
    elif route == "/v1/completions":
        body = {"model": model, "prompt": rng.choice([text, [text, text], [1, 2, 3]]),
                "max_tokens": rng.randint(1, 4)}
    elif route == "/v1/embeddings":
        body = {"model": model, "input": rng.choice([text, [text], [1, 2]])}
    else:
        body = rng.choice([{"model": model, "prompt": text},
                           {"model": model, "messages": [{"role": "user", "content": text}]}])
    for key in ("temperature", "top_p", "n", "seed", "logprobs", "stream", "stop", "top_k",
                "presence_penalty", "logit_bias", "min_tokens", "echo", "user"):
        if rng.random() < 0.06:
            body[key] = _weird(rng)
    return body


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into ``value`` (dict keys and list indexes)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _set(value: Any, path: tuple, new: Any, delete: bool = False) -> None:
    for step in path[:-1]:
        value = value[step]
    if delete:
        del value[path[-1]]
    else:
        value[path[-1]] = new


def mutate(rng: random.Random, body: dict) -> bytes:
    """The body after one to three mutations, as the bytes sent."""
    for _ in range(rng.randint(1, 3)):
        paths = _paths(body)
        op = rng.randrange(10)
        path = rng.choice(paths) if paths else None
        if op <= 2 and path:  # a field of the wrong type or a weird value
            _set(body, path, _weird(rng))
        elif op == 3 and path:  # a field dropped
            _set(body, path, None, delete=True)
        elif op == 4:  # an unknown field
            body[rng.choice(["extra", "guided_json", "priority", "kv_transfer_params",
                             "cache_salt", "chat_template", "truncate_prompt_tokens",
                             "mm_processor_kwargs", "add_special_tokens"])] = _weird(rng)
        elif op == 5 and path:  # nesting near and past the gate's limit
            depth = rng.choice([10, 60, 70, 300])
            nested: Any = "x"
            for _ in range(depth):
                nested = [nested] if rng.random() < 0.5 else {"a": nested}
            _set(body, path, nested)
        elif op == 6:  # huge n, huge max_tokens, huge prompt lists
            key, val = rng.choice([("n", rng.choice([2, 8, 1000, 2**40])),
                                   ("max_tokens", rng.choice([0, -5, 10**9, 2**70])),
                                   ("prompt", ["p"] * rng.choice([5, 100, 3000])),
                                   ("best_of", rng.choice([2, 100])),
                                   ("logprobs", rng.choice([True, 20, 10**6])),
                                   ("top_logprobs", rng.choice([5, 21, 10**6]))])
            body[key] = val
        elif op == 7 and path:  # odd unicode in a string
            _set(body, path, rng.choice(WEIRD_STRINGS) + "\ud83d" * rng.randrange(2))
        elif op == 8:  # a pathological structured output (bounded by the gate, not by size)
            body["structured_outputs"] = rng.choice([
                {"regex": "a" * rng.randrange(1, 50)}, {"choice": [_weird(rng)]},
                {"json": {"type": "string", "maxLength": rng.choice([5, 100])}},
                {"grammar": "root ::= " + "(" * rng.randrange(1, 40)}])
    raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.08:  # cut short
        return raw[:rng.randrange(len(raw) + 1)]
    if r < 0.16:  # bytes flipped
        b = bytearray(raw)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if r < 0.20:  # not JSON at all
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
    return raw


def cases(seed: int, count: int, model: str = "default") -> list[tuple[str, bytes, str]]:
    """(route, body, content type) for ``count`` bodies from ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        route = rng.choice(ROUTES)
        body = mutate(rng, base_body(rng, route, model))
        ctype = "application/json" if rng.random() < 0.95 else rng.choice(
            ["text/plain", "application/x-www-form-urlencoded", "", "application/json; charset=latin-1"])
        out.append((route, body, ctype))
    return out


async def send_all(base_url: str, items: list[tuple[str, bytes, str]], *, api_key: str | None,
                   concurrency: int = 4, timeout_s: float = 300.0,
                   transport: Any = None) -> tuple[Counter, dict, list[dict]]:
    """Send every body; (statuses, statuses by route, the 5xx and transport failures)."""
    import httpx

    statuses: Counter = Counter()
    by_route: dict[str, Counter] = {r: Counter() for r in ROUTES}
    bad: list[dict] = []
    queue = list(enumerate(items))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def worker(client: Any) -> None:
        while queue:
            i, (route, body, ctype) = queue.pop(0)
            hdrs = dict(headers, **({"Content-Type": ctype} if ctype else {}))
            try:
                r = await client.post(route, content=body, headers=hdrs)
                status: Any = r.status_code
                detail = r.text[:300]
            except Exception as exc:  # a dropped connection is as bad as a 5xx
                status, detail = f"client_error:{type(exc).__name__}", str(exc)[:300]
            statuses[status] += 1
            by_route[route][status] += 1
            if not isinstance(status, int) or status >= 500:
                bad.append({"case": i, "route": route, "status": status,
                            "body_head": body[:300].decode("utf-8", "backslashreplace"),
                            "detail": detail})

    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, trust_env=False,
                                 transport=transport) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return statuses, by_route, bad


def run(model: str = "default", *, seed: int = 0, count: int = 10_000, concurrency: int = 4,
        max_model_len: int = 512, enforce_eager: bool = True, out: str | None = None) -> dict:
    """Start `vllm-edge serve` with an API key on a free loopback port, send ``count`` fuzzed
    bodies, stop it; the artifact (counts by status, seed, duration, provenance) goes to
    ``out`` atomically."""
    import secrets

    import httpx

    from vllm_edge.bench import soak
    from vllm_edge.common import atomic, provenance

    key = secrets.token_urlsafe(16)
    port = soak.free_port()
    log_path = Path(out).with_suffix(".server.log") if out else Path("fuzz.server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = [model, "--max-model-len", str(max_model_len), "--api-key", key,
            *(["--enforce-eager"] if enforce_eager else [])]
    items = cases(seed, count)
    t = time.time()
    proc = soak.start_server(args, port, log_path)
    ready_s = time.time() - t
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        statuses, by_route, bad = asyncio.run(send_all(base, items, api_key=key,
                                                       concurrency=concurrency))
        wall = time.time() - t0
        health = httpx.get(base + "/health", timeout=30, trust_env=False).status_code
        root = httpx.get(base + "/v1/models", timeout=30, trust_env=False,
                         headers={"Authorization": f"Bearer {key}"}).json()["data"][0].get("root")
    finally:
        rc = soak.stop_server(proc)
    n5xx = sum(n for s, n in statuses.items() if not isinstance(s, int) or s >= 500)
    result = {
        "what": "seeded mutated request bodies to a real `vllm-edge serve` through its gate",
        "seed": seed, "bodies": count, "concurrency": concurrency, "routes": list(ROUTES),
        "wall_s": round(wall, 1), "bodies_per_s": round(count / wall, 1),
        "by_status": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))},
        "by_route": {r: {str(k): v for k, v in sorted(c.items(), key=lambda kv: str(kv[0]))}
                     for r, c in by_route.items()},
        "http_5xx": n5xx, "failures": bad[:50], "health_after": health,
        "passed": n5xx == 0 and health == 200,
        "server": {"ready_s": round(ready_s, 1), "serve_args": [a if a != key else "***" for a in args],
                   "returncode": rc},
    }
    result["provenance"] = provenance.collect(model=root, threads=None)
    if out:
        atomic.write_json(out, result)
    return result
