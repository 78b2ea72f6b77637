"""`vllm-edge bench soak`: concurrent clients against a running `vllm-edge serve`.

Each client loops over a fixed mix of requests until the time or request budget runs
out: streaming chat, non-streaming chat, tool calls (``required``, a named function and
``auto``), streams the client abandons mid-way, and prompts longer than the context.
Every response gets an outcome class; the ones a healthy server produces are listed in
``EXPECTED``, anything else is an error. Streams give TTFT and TPOT. The server's
process tree is sampled for RssAnon all along, so a leak shows as a rising line after
warm-up. Loopback only: this is a load generator, and it must never point elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import urlparse

from vllm_edge.bench import prompts
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.procmem import TreeSampler
from vllm_edge.common.stats import percentiles
from vllm_edge.serving.gate_compile import WORKER_MODULE

# kind -> share of the mix; a client walks a shuffled cycle of this list
MIX = {"stream": 3, "nonstream": 2, "tool_required": 1, "tool_named": 1, "tool_auto": 1,
       "cancel": 1, "overlong": 1}
# Outcome classes a healthy server produces. Everything else counts as an error.
EXPECTED = {"ok", "ok_tool_calls", "ok_no_tool_call", "tool_call_cut_at_max_tokens", "cancelled",
            "rejected_overlong"}
FLAT_PCT = 5.0
# --hostile: requests the gate must refuse, mixed into the same clients, and the class each
# must get. A slow body (slowloris) runs beside them on its own connection.
HOSTILE_MIX = {"oversized": 1, "bad_key": 1, "huge_n": 1, "slow_schema": 1, "deep_json": 1}
HOSTILE_EXPECTED = {"oversized": (413, "rejected_413"), "bad_key": (401, "rejected_401"),
                    "huge_n": (400, "rejected_n"), "slow_schema": (400, "rejected_schema"),
                    "deep_json": (400, "rejected_deep")}
HOSTILE_CLASSES = {c for _, c in HOSTILE_EXPECTED.values()} | {"rejected_408"}


async def sse_lines(resp: Any) -> AsyncIterator[str]:
    """Server-sent-event lines, split on CR/LF only. httpx's ``aiter_lines`` splits like
    ``str.splitlines`` (also on U+0085, U+2028, ...), which the model may generate inside a
    JSON string: the 10-minute soak's one client error was such a split chunk."""
    buf = ""
    async for text in resp.aiter_text():
        buf += text
        *lines, buf = re.split(r"\r\n|\r|\n", buf)
        for line in lines:
            yield line
    if buf:
        yield buf


def hostile_request(kind: str, rng: random.Random, model: str = "default") -> tuple[bytes, dict]:
    """(body, extra headers) of one hostile request of ``kind`` (a key of HOSTILE_MIX), sent
    to /v1/chat/completions with the soak's key unless the headers replace it."""
    chat = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    headers: dict = {}
    if kind == "oversized":  # over the gate's default cap: refused on Content-Length
        content = b'{"prompt": "' + b"x" * (5 << 20) + b'"}'
    elif kind == "bad_key":
        content, headers = json.dumps(chat).encode(), {"Authorization": "Bearer wrong"}
    elif kind == "huge_n":
        content = json.dumps(dict(chat, n=rng.choice([1000, "1000", 2**40]))).encode()
    elif kind == "slow_schema":  # small, but minutes for xgrammar; values vary: no cache
        base = rng.randrange(1000, 10**6)
        schema = {"type": "object", "properties": {
            f"p{i}": {"type": "string", "maxLength": base + i} for i in range(12)}}
        content = json.dumps(dict(chat, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema}})).encode()
    elif kind == "deep_json":  # far past the gate's depth limit
        content = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    else:
        raise ValueError(kind)
    return content, headers


class SoakError(EdgeError):
    pass


@dataclass
class Outcome:
    kind: str
    cls: str
    t: float  # seconds since the start of the soak
    latency_s: float
    status: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int | None = None
    detail: str = ""


def require_loopback(base_url: str) -> str:
    host = urlparse(base_url).hostname or ""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise SoakError(f"{base_url}: cannot resolve {host!r} ({exc})") from None
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise SoakError(f"{base_url}: the soak test runs against loopback only "
                        f"({host} resolves to {sorted(addrs)})")
    return base_url.rstrip("/")


def _chat_messages(rng: random.Random) -> list[dict]:
    chats = [p for p in prompts.fidelity_prompts() if p["kind"] == "chat"]
    return rng.choice(chats)["messages"]


def _tool_messages(rng: random.Random) -> list[dict]:
    # the user turn only: the chat template renders `tools` itself
    tool = [p for p in prompts.fidelity_prompts() if p["kind"] == "tool"]
    return [m for m in rng.choice(tool)["messages"] if m["role"] == "user"]


@dataclass
class Soak:
    base_url: str
    model: str
    max_model_len: int
    max_tokens: int = 48
    timeout_s: float = 300.0
    overlong_text: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    t0: float = 0.0
    api_key: str | None = None
    hostile: bool = False

    async def _stream(self, client: Any, body: dict, cancel_after: int | None) -> tuple[str, dict]:
        """(class, timings). ``cancel_after``: close the connection after that many tokens."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        t_send = time.perf_counter()
        first = last = None
        chunks = 0
        tokens = None
        done = False
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return _http_class(resp.status_code), {"status": resp.status_code,
                                                       "detail": resp.text[:200]}
            async for line in sse_lines(resp):
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                obj = json.loads(data)
                if obj.get("usage"):
                    tokens = obj["usage"].get("completion_tokens")
                for ch in obj.get("choices") or []:
                    if (ch.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        chunks += 1
                if cancel_after is not None and chunks >= cancel_after:
                    break  # leaving the block closes the connection mid-stream
        timing = {"status": 200, "ttft_s": (first - t_send) if first else None}
        if cancel_after is not None:
            return ("cancelled" if chunks >= cancel_after else "stream_ended_early"), timing
        if not done:
            return "stream_truncated", timing
        n = tokens or chunks
        timing["tokens"] = n
        if first and last and n > 1:
            timing["tpot_s"] = (last - first) / (n - 1)
        return ("ok" if first else "empty_stream"), timing

    async def _post(self, client: Any, body: dict) -> tuple[int, dict | None, str]:
        resp = await client.post("/v1/chat/completions", json=body)
        try:
            obj = resp.json()
        except ValueError:
            obj = None
        return resp.status_code, obj, resp.text[:200]

    async def one(self, client: Any, kind: str, rng: random.Random) -> Outcome:
        t_start = time.perf_counter()
        base = {"model": self.model, "max_tokens": self.max_tokens}
        info: dict = {}
        try:
            if kind == "stream":
                cls, info = await self._stream(client, dict(base, messages=_chat_messages(rng)), None)
            elif kind == "cancel":
                body = dict(base, messages=_chat_messages(rng), max_tokens=self.max_model_len // 2,
                            ignore_eos=True)
                cls, info = await self._stream(client, body, cancel_after=rng.randint(2, 8))
            elif kind == "nonstream":
                status, obj, text = await self._post(client, dict(base, messages=_chat_messages(rng)))
                info = {"status": status, "detail": text}
                cls = _http_class(status) if status != 200 else (
                    "ok" if obj and obj["choices"][0]["message"].get("content") is not None
                    else "bad_body")
                if obj and status == 200:
                    info["tokens"] = obj.get("usage", {}).get("completion_tokens")
            elif kind.startswith("tool_"):
                choice = {"tool_required": "required", "tool_auto": "auto"}.get(kind)
                if choice is None:
                    fn = rng.choice(prompts.TOOLS)["function"]["name"]
                    choice = {"type": "function", "function": {"name": fn}}
                body = dict(base, messages=_tool_messages(rng), tools=prompts.TOOLS,
                            tool_choice=choice, max_tokens=max(self.max_tokens, 128))
                status, obj, text = await self._post(client, body)
                info = {"status": status, "detail": text}
                cls = _http_class(status) if status != 200 else _tool_class(obj, choice)
                if obj and status == 200:
                    ch = obj["choices"][0]
                    info["detail"] = (f"finish_reason={ch.get('finish_reason')} content tail="
                                      f"{(ch['message'].get('content') or '')[-160:]!r}")
                    info["tokens"] = obj.get("usage", {}).get("completion_tokens")
            elif kind in HOSTILE_EXPECTED:
                status, text = await self._hostile(client, kind, rng)
                want, ok_cls = HOSTILE_EXPECTED[kind]
                info = {"status": status, "detail": text}
                cls = ok_cls if status == want else _http_class(status)
            elif kind == "overlong":
                body = dict(base, messages=[{"role": "user", "content": self.overlong_text}])
                status, obj, text = await self._post(client, body)
                info = {"status": status, "detail": text}
                msg = json.dumps(obj) if obj else text
                cls = ("rejected_overlong" if status == 400 and "context length" in msg
                       else _http_class(status) if status != 200 else "overlong_accepted")
            else:
                raise ValueError(kind)
        except asyncio.TimeoutError:
            cls = "timeout"
        except Exception as exc:  # every transport failure is an outcome, never a crash
            name = type(exc).__name__
            cls = "timeout" if "Timeout" in name else f"client_error:{name}"
            info = {"detail": str(exc)[:200]}
        now = time.perf_counter()
        return Outcome(kind, cls, t_start - self.t0, now - t_start, info.get("status"),
                       info.get("ttft_s"), info.get("tpot_s"), info.get("tokens"),
                       info.get("detail", "") if cls not in EXPECTED else "")

    async def _hostile(self, client: Any, kind: str, rng: random.Random) -> tuple[int, str]:
        content, headers = hostile_request(kind, rng, self.model)
        resp = await client.post("/v1/chat/completions", content=content,
                                 headers={"Content-Type": "application/json", **headers})
        return resp.status_code, resp.text[:200]

    async def slowloris_loop(self, deadline: float, port: int) -> None:
        """A body that never finishes: headers and a few bytes, then silence, until the
        server answers (the gate's body deadline) or closes."""
        while time.perf_counter() < deadline:
            t_start = time.perf_counter()
            cls, status, detail = "no_answer", None, ""
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                key = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
                writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{key}"
                              "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                              '{"messages": [').encode())
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), 180)
                writer.close()
                parts = line.split()
                status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
                cls = "rejected_408" if status == 408 else (
                    _http_class(status) if status else "no_answer")
                detail = line[:100].decode("latin-1")
            except Exception as exc:  # every transport failure is an outcome
                cls, detail = f"client_error:{type(exc).__name__}", str(exc)[:200]
            now = time.perf_counter()
            self.outcomes.append(Outcome("slowloris", cls, t_start - self.t0, now - t_start,
                                         status, detail=detail if cls != "rejected_408" else ""))

    async def client_loop(self, idx: int, deadline: float, budget: list[int], seed: int) -> None:
        import httpx

        rng = random.Random(seed * 1000 + idx)
        mix = {**MIX, **HOSTILE_MIX} if self.hostile else MIX
        cycle = [k for k, n in mix.items() for _ in range(n)]
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s,
                                     trust_env=False, headers=headers) as client:
            i = 0
            while time.perf_counter() < deadline and budget[0] > 0:
                budget[0] -= 1
                if i % len(cycle) == 0:
                    rng.shuffle(cycle)
                self.outcomes.append(await self.one(client, cycle[i % len(cycle)], rng))
                i += 1


def _http_class(status: int) -> str:
    if status >= 500:
        return f"http_{status}"
    return f"http_{status}_unexpected"


def _tool_class(obj: dict | None, choice: Any) -> str:
    if not obj:
        return "bad_body"
    calls = obj["choices"][0]["message"].get("tool_calls") or []
    for call in calls:
        try:
            if not isinstance(json.loads(call["function"]["arguments"]), dict):
                return "tool_arguments_not_object"
        except (ValueError, KeyError, TypeError):
            return "tool_arguments_invalid_json"
    if calls:
        if isinstance(choice, dict) and calls[0]["function"]["name"] != choice["function"]["name"]:
            return "tool_wrong_function"
        return "ok_tool_calls"
    if choice == "auto":
        return "ok_no_tool_call"  # `auto` may answer in prose
    if obj["choices"][0].get("finish_reason") == "length":
        # the schema holds the call, but a rambling string argument can outlast max_tokens:
        # the client's budget ran out, the server did what it was asked
        return "tool_call_cut_at_max_tokens"
    return "tool_call_missing"


def _rss_stats(points: list[tuple[float, float]], warmup_s: float) -> dict[str, Any]:
    """Spread, drift and least-squares slope of (seconds, MB) samples after warm-up."""
    after = [(t, mb) for t, mb in points if t >= warmup_s]
    out: dict[str, Any] = {"warmup_s": warmup_s, "samples_after_warmup": len(after)}
    if not after:
        return out
    mbs = [mb for _, mb in after]
    lo, hi, med = min(mbs), max(mbs), statistics.median(mbs)
    q = max(1, len(mbs) // 4)
    out.update({
        "min_mb": lo, "max_mb": hi, "median_mb": med,
        "spread_pct": round(100.0 * (hi - lo) / med, 2),
        # first quarter vs last quarter after warm-up: a leak rises, noise does not
        "drift_pct": round(100.0 * (statistics.median(mbs[-q:]) - statistics.median(mbs[:q])) / med, 2),
    })
    out["flat_within_5pct"] = out["spread_pct"] <= FLAT_PCT
    if len(after) > 1:  # least squares over the samples after warm-up
        mt = statistics.fmean(t for t, _ in after)
        var = sum((t - mt) ** 2 for t, _ in after)
        mm = statistics.fmean(mbs)
        slope = sum((t - mt) * (mb - mm) for t, mb in after) / var if var else 0.0
        out["slope_mb_per_min"] = round(slope * 60, 3)
    return out


def _summary(outcomes: list[Outcome], samples: list[tuple[float, float, int]], t0_wall: float,
             warmup_s: float, wall_s: float, worker_mb: list[float] | None = None,
             worker_starts: int = 0) -> dict:
    """``worker_mb``: the schema compiler's share of each sample. The gate kills it past its
    budget and the next schema starts a new one, so with slow schemas in the mix the whole
    tree is a sawtooth of the worker's size: the flatness check is on the tree without it, and both
    are kept."""
    by_class: dict[str, int] = {}
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        by_class[o.cls] = by_class.get(o.cls, 0) + 1
        by_kind.setdefault(o.kind, {})
        by_kind[o.kind][o.cls] = by_kind[o.kind].get(o.cls, 0) + 1
    errors = {c: n for c, n in by_class.items() if c not in EXPECTED and c not in HOSTILE_CLASSES}
    ttft = [o.ttft_s for o in outcomes if o.kind == "stream" and o.ttft_s is not None]
    tpot = [o.tpot_s for o in outcomes if o.tpot_s is not None]
    lat = {k: [o.latency_s for o in outcomes if o.kind == k and o.cls in EXPECTED]
           for k in MIX}
    rss = [(round(t - t0_wall, 1), round(mb, 1), n) for t, mb, n in samples]
    rss_summary = _rss_stats([(t, mb) for t, mb, _ in rss], warmup_s)
    flat = bool(rss_summary.get("flat_within_5pct"))
    worker: dict[str, Any] | None = None
    if worker_mb is not None and len(worker_mb) == len(rss):
        server = [(t, round(mb - w, 1)) for (t, mb, _), w in zip(rss, worker_mb)]
        rss_summary["without_compile_worker"] = _rss_stats(server, warmup_s)
        present = [w for w in worker_mb if w > 0]
        worker = {"starts": worker_starts, "samples_present": len(present),
                  "max_mb": round(max(present), 1) if present else 0.0,
                  "median_mb": round(statistics.median(present), 1) if present else 0.0}
        rss_summary["compile_worker"] = worker
        rss_summary["flat_check_on"] = "without_compile_worker"
        flat = bool(rss_summary["without_compile_worker"].get("flat_within_5pct"))
    n5xx = sum(n for c, n in by_class.items() if c.startswith("http_5"))
    return {
        "requests": len(outcomes),
        "wall_s": round(wall_s, 1),
        "by_class": dict(sorted(by_class.items())),
        "by_kind": by_kind,
        "errors": errors,
        "http_5xx": n5xx,
        "ttft_s": {**percentiles(ttft), "n": len(ttft)},
        "tpot_s": {**percentiles(tpot), "n": len(tpot)},
        "latency_s": {k: {**percentiles(v), "n": len(v)} for k, v in lat.items()},
        "rss_anon": rss_summary,
        "rss_anon_samples": rss,
        **({"rss_anon_compile_worker_samples": [round(w, 1) for w in worker_mb]}
           if worker is not None and worker_mb is not None else {}),
        "passed": n5xx == 0 and not errors and flat,
    }


def run_against(base_url: str, server_pid: int, *, model: str = "default", duration_s: float = 600,
                max_requests: int = 100_000, clients: int = 8, max_model_len: int = 2048,
                warmup_s: float | None = None, sample_s: float = 2.0, seed: int = 0,
                api_key: str | None = None, hostile: bool = False) -> dict:
    """Soak a server that is already up; ``server_pid`` roots the RssAnon tree."""
    import httpx

    base_url = require_loopback(base_url)
    if httpx.get(base_url + "/health", timeout=30, trust_env=False).status_code != 200:
        raise SoakError(f"{base_url}/health is not 200: is the server up?")
    warmup_s = duration_s * 0.2 if warmup_s is None else warmup_s
    soak = Soak(base_url, model, max_model_len,
                overlong_text=prompts.long_document(("datamodel",), min_words=max_model_len + 64),
                api_key=api_key, hostile=hostile)
    budget = [max_requests]

    async def main() -> None:
        soak.t0 = time.perf_counter()
        deadline = soak.t0 + duration_s
        loops = [soak.client_loop(i, deadline, budget, seed) for i in range(clients)]
        if hostile:
            loops.append(soak.slowloris_loop(deadline, urlparse(base_url).port or 80))
        await asyncio.gather(*loops)

    t0_wall = time.time()
    with TreeSampler(root_pid=server_pid, interval=sample_s, keep_samples=True,
                     apart=WORKER_MODULE) as sampler:
        asyncio.run(main())
    wall = time.time() - t0_wall
    out = _summary(soak.outcomes, sampler.samples, t0_wall, warmup_s, wall,
                   worker_mb=sampler.apart_samples, worker_starts=len(sampler.apart_pids))
    health = httpx.get(base_url + "/health", timeout=30, trust_env=False).status_code
    out["health_after"] = health
    # the directory the server loaded, as vLLM reports it
    models = httpx.get(base_url + "/v1/models", timeout=30, trust_env=False,
                       headers={"Authorization": f"Bearer {api_key}"} if api_key else None).json()
    out["model_root"] = models["data"][0].get("root")
    out["passed"] = out["passed"] and health == 200
    out["config"] = {"base_url": base_url, "model": model, "duration_s": duration_s,
                     "max_requests": max_requests, "clients": clients, "mix": MIX,
                     "max_model_len": max_model_len, "max_tokens": soak.max_tokens,
                     "sample_s": sample_s, "seed": seed, "hostile": hostile,
                     "hostile_mix": HOSTILE_MIX if hostile else None}
    out["errors_sample"] = [o.__dict__ for o in soak.outcomes
                            if o.cls not in EXPECTED and o.cls not in HOSTILE_CLASSES][:20]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(serve_args: list[str], port: int, log_path: Path,
                 ready_timeout_s: float = 900) -> subprocess.Popen:
    """`vllm-edge serve` in its own session (so the whole tree can be killed), up when
    /health answers 200."""
    import httpx

    log = open(log_path, "w")
    # ours first: serve_args may end with `-- <vLLM flags>`
    proc = subprocess.Popen([sys.executable, "-m", "vllm_edge.cli", "serve", "--port", str(port),
                             "--host", "127.0.0.1", *serve_args],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + ready_timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SoakError(f"the server exited with {proc.returncode} before it was ready; "
                            f"see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(proc)
    raise SoakError(f"the server was not ready after {ready_timeout_s:.0f} s; see {log_path}")


def stop_server(proc: subprocess.Popen, grace_s: float = 30) -> int | None:
    """SIGTERM to the server's process group, then SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.poll()
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait(10)


def run(model: str = "default", *, duration_s: float = 600, max_requests: int = 100_000,
        clients: int = 8, max_model_len: int = 2048, serve_args: list[str] | None = None,
        base_url: str | None = None, server_pid: int | None = None, out: str | None = None,
        warmup_s: float | None = None, seed: int = 0, repeat: int = 1,
        hostile: bool = False) -> dict:
    """Start a server (unless ``base_url`` and ``server_pid`` name one), soak it ``repeat``
    times in a row (seeds ``seed``, ``seed + 1``, ...), write the result atomically with
    provenance. With ``repeat`` > 1 the result holds every run and how many passed in a row."""
    from vllm_edge.common import atomic, provenance

    if repeat < 1:
        raise SoakError(f"--repeat {repeat}: must be at least 1")
    proc = None
    log_path = Path(out).with_suffix(".server.log") if out else Path("soak.server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    api_key = None
    if base_url is None:
        port = free_port()
        args = [model, "--max-model-len", str(max_model_len), *(serve_args or [])]
        if hostile:  # the bad-key requests need a key to be wrong against
            import secrets

            api_key = secrets.token_urlsafe(16)
            args += ["--api-key", api_key]
        t = time.time()
        proc = start_server(args, port, log_path)
        ready_s = time.time() - t
        base_url, server_pid = f"http://127.0.0.1:{port}", proc.pid
    elif server_pid is None:
        raise SoakError("--base-url needs --server-pid (the root of the tree whose RssAnon is sampled)")
    runs: list[dict] = []
    try:
        for i in range(repeat):
            runs.append(run_against(base_url, server_pid, model=model, duration_s=duration_s,
                                    max_requests=max_requests, clients=clients,
                                    max_model_len=max_model_len, warmup_s=warmup_s, seed=seed + i,
                                    api_key=api_key, hostile=hostile))
    finally:
        if proc is not None:
            stop_server(proc)
    if repeat == 1:
        result = runs[0]
    else:
        # what the suite's short soak asserts: no error class, no 5xx, healthy after
        clean = [r["errors"] == {} and r["http_5xx"] == 0 and r["health_after"] == 200 for r in runs]
        result = {"repeat": repeat, "runs": runs,
                  "clean_runs": sum(clean),
                  "clean_in_a_row": next((i for i, ok in enumerate(clean) if not ok), repeat),
                  "passed": all(r["passed"] for r in runs),
                  "model_root": runs[-1].get("model_root")}
    if proc is not None:
        result["server"] = {"ready_s": round(ready_s, 1),
                            "serve_args": ["***" if a == api_key else a for a in args],
                            "log": str(log_path), "returncode": proc.returncode}
    result["provenance"] = provenance.collect(model=result.get("model_root"), threads=None)
    if out:
        atomic.write_json(out, result)
    return result
