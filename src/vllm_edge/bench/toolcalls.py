"""Tool-call stress: many named / required / auto calls against a running `vllm-edge serve`.

The contract checked here: a request that names a tool or asks for ``required`` comes
back with a valid call (it exists, names the requested tool, or one of the offered tools
for ``required``, and its arguments are JSON that satisfies the tool's parameters schema),
or with ``finish_reason: "length"``. Anything else is a violation, counted per cell
(temperature x stream). Neighbours the soak also sends (abandoned streams, over-long
prompts) run between the calls, so a constrained request shares its batch with aborts.

Requests, the soak's classifier and the server start/stop come from :mod:`soak`; this
module adds the streamed variant, the schema check and the per-cell bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_edge.bench import prompts, soak
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.schema import schema_errors

# share of each kind in a client's cycle; cancel/overlong are the soak's neighbours
MIX = {"tool_named": 4, "tool_required": 2, "tool_auto": 1, "cancel": 1, "overlong": 1}
CONSTRAINED = ("tool_named", "tool_required")


class ToolStressError(EdgeError):
    pass


def judge(message: dict, finish_reason: str | None, choice: Any, tools: list[dict]) -> str:
    """``valid``, ``length`` (allowed: the budget ran out), or the violation."""
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    calls = message.get("tool_calls") or []
    verdict = "missing"
    if calls:
        fn = calls[0].get("function") or {}
        name = fn.get("name")
        want = choice["function"]["name"] if isinstance(choice, dict) else None
        if (want and name != want) or name not in by_name:
            verdict = "wrong_function"
        else:
            try:
                args = json.loads(fn.get("arguments") or "")
            except ValueError:
                verdict = "invalid_json"
            else:
                params = by_name[name].get("parameters") or {}
                verdict = "schema_invalid" if schema_errors(args, params) else "valid"
    if verdict != "valid" and finish_reason == "length":
        return "length"
    return verdict


def assemble_stream(chunks: list[dict]) -> tuple[dict, str | None]:
    """A non-streamed ``message`` and ``finish_reason`` from streamed chunks: content joined,
    tool calls joined by ``index`` (name from the first delta that has one, arguments
    concatenated)."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    finish = None
    for obj in chunks:
        for ch in obj.get("choices") or []:
            delta = ch.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                             "function": {"name": None,
                                                                          "arguments": ""}})
                slot["id"] = slot["id"] or tc.get("id")
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = slot["function"]["name"] or fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    message = {"role": "assistant", "content": "".join(content) or None,
               "tool_calls": [calls[i] for i in sorted(calls)]}
    return message, finish


@dataclass
class Cell:
    temperature: float
    stream: bool
    requests: dict[str, int] = field(default_factory=dict)  # kind -> sent
    verdicts: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> verdict -> n
    soak_classes: dict[str, dict[str, int]] = field(default_factory=dict)  # the soak's view
    failures: list[dict] = field(default_factory=list)
    wall_s: float = 0.0

    def count(self, table: dict, kind: str, key: str) -> None:
        table.setdefault(kind, {})
        table[kind][key] = table[kind].get(key, 0) + 1

    def summary(self, keep_failures: int = 30) -> dict:
        def transport(v: str) -> bool:
            return v.startswith("client_error:")

        # a request the client gave up on (a loaded host) says nothing about the answer
        unanswered = {k: sum(n for v, n in self.verdicts.get(k, {}).items() if transport(v))
                      for k in CONSTRAINED}
        violations = {k: sum(n for v, n in self.verdicts.get(k, {}).items()
                             if v not in ("valid", "length") and not transport(v))
                      for k in CONSTRAINED}
        done = {k: sum(self.verdicts.get(k, {}).values()) - unanswered[k] for k in CONSTRAINED}
        return {"temperature": self.temperature, "stream": self.stream,
                "wall_s": round(self.wall_s, 1), "requests": self.requests,
                "verdicts": self.verdicts, "soak_classes": self.soak_classes,
                "constrained_calls": done, "unanswered": unanswered, "violations": violations,
                "violation_rate": {k: (violations[k] / done[k] if done[k] else None)
                                   for k in CONSTRAINED},
                "failures_sample": self.failures[:keep_failures]}


async def tool_request(client: Any, base: soak.Soak, kind: str, rng: random.Random,
                       temperature: float, stream: bool, max_tokens: int) -> dict:
    """One tool request; the verdict, the soak's class for it, and what came back."""
    choice: Any = {"tool_required": "required", "tool_auto": "auto"}.get(kind)
    if choice is None:
        fn = rng.choice(prompts.TOOLS)["function"]["name"]
        choice = {"type": "function", "function": {"name": fn}}
    body = {"model": base.model, "messages": soak._tool_messages(rng), "tools": prompts.TOOLS,
            "tool_choice": choice, "max_tokens": max_tokens, "temperature": temperature}
    out: dict = {"kind": kind, "choice": choice, "stream": stream}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
        chunks, done = [], False
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            out["status"] = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                out["detail"] = resp.text[:300]
            else:
                async for line in soak.sse_lines(resp):
                    if line.startswith("data: "):
                        if line[6:] == "[DONE]":
                            done = True
                            break
                        chunks.append(json.loads(line[6:]))
        if out["status"] == 200:
            message, finish = assemble_stream(chunks)
            obj = {"choices": [{"message": message, "finish_reason": finish}]}
            out["stream_done"] = done
    else:
        resp = await client.post("/v1/chat/completions", json=body)
        out["status"] = resp.status_code
        obj = resp.json() if resp.status_code == 200 else None
        if obj is None:
            out["detail"] = resp.text[:300]
    if out["status"] != 200:
        out["verdict"] = out["soak_class"] = soak._http_class(out["status"])
        return out
    ch = obj["choices"][0]
    out["finish_reason"] = ch.get("finish_reason")
    out["message"] = ch["message"]
    out["soak_class"] = soak._tool_class(obj, choice)
    out["verdict"] = ("auto" if kind == "tool_auto"
                      else judge(ch["message"], ch.get("finish_reason"), choice, prompts.TOOLS))
    if stream and not out.get("stream_done"):
        out["verdict"] = "stream_truncated"
    return out


async def _client(idx: int, cell: Cell, base: soak.Soak, budget: list[int], deadline: float,
                  seed: int, max_tokens: int) -> None:
    import httpx

    rng = random.Random(seed * 7919 + idx)
    cycle = [k for k, n in MIX.items() for _ in range(n)]
    async with httpx.AsyncClient(base_url=base.base_url, timeout=base.timeout_s,
                                 trust_env=False) as client:
        i = 0
        while budget[0] > 0 and time.perf_counter() < deadline:
            if i % len(cycle) == 0:
                rng.shuffle(cycle)
            kind = cycle[i % len(cycle)]
            i += 1
            cell.requests[kind] = cell.requests.get(kind, 0) + 1
            if kind in ("cancel", "overlong"):
                o = await base.one(client, kind, rng)
                cell.count(cell.soak_classes, kind, o.cls)
                continue
            if kind in CONSTRAINED:
                budget[0] -= 1
            try:
                r = await tool_request(client, base, kind, rng, cell.temperature, cell.stream,
                                       max_tokens)
            except Exception as exc:  # a transport failure is a verdict too
                r = {"kind": kind, "verdict": f"client_error:{type(exc).__name__}",
                     "soak_class": f"client_error:{type(exc).__name__}", "detail": str(exc)[:200]}
            cell.count(cell.verdicts, kind, r["verdict"])
            cell.count(cell.soak_classes, kind, r["soak_class"])
            if kind in CONSTRAINED and r["verdict"] not in ("valid", "length"):
                cell.failures.append(r)


def run_cell(base_url: str, *, temperature: float, stream: bool, calls: int, clients: int = 8,
             max_seconds: float = 600, max_tokens: int = 128, model: str = "default",
             max_model_len: int = 2048, seed: int = 0) -> Cell:
    """``calls`` named+required requests (or until ``max_seconds``) from ``clients`` clients."""
    base = soak.Soak(soak.require_loopback(base_url), model, max_model_len,
                     overlong_text=prompts.long_document(("datamodel",),
                                                         min_words=max_model_len + 64))
    cell = Cell(temperature, stream)
    budget = [calls]

    async def main() -> None:
        base.t0 = time.perf_counter()
        deadline = base.t0 + max_seconds
        await asyncio.gather(*(_client(i, cell, base, budget, deadline, seed, max_tokens)
                               for i in range(clients)))

    t = time.perf_counter()
    asyncio.run(main())
    cell.wall_s = time.perf_counter() - t
    return cell


def parse_cells(spec: str) -> list[tuple[float, bool]]:
    """``"0:nonstream,1:stream"`` -> [(0.0, False), (1.0, True)]."""
    cells = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        temp, _, mode = part.partition(":")
        if mode not in ("stream", "nonstream"):
            raise ToolStressError(f"cell {part!r}: write TEMPERATURE:stream or TEMPERATURE:nonstream")
        try:
            cells.append((float(temp), mode == "stream"))
        except ValueError:
            raise ToolStressError(f"cell {part!r}: {temp!r} is not a temperature") from None
    return cells


def run(model: str = "default", *, cells: list[tuple[float, bool]], calls: int = 2000,
        clients: int = 8, max_seconds_per_cell: float = 600, max_tokens: int = 128,
        serve_args: list[str] | None = None, base_url: str | None = None,
        out: str | None = None, seed: int = 0, label: str = "") -> dict:
    """Start a server (unless ``base_url``), run each cell, write ``out`` atomically with
    provenance."""
    import httpx

    from vllm_edge.common import atomic, provenance

    proc = None
    log_path = Path(out).with_suffix(".server.log") if out else Path("toolcalls.server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = None
    if base_url is not None:
        base_url = soak.require_loopback(base_url)
    else:
        port = soak.free_port()
        args = [model, *(serve_args or [])]
        proc = soak.start_server(args, port, log_path)
        base_url = f"http://127.0.0.1:{port}"
    results: list[dict] = []

    def write(complete: bool, root: str | None) -> dict:
        result = {
            "label": label,
            "contract": "named/required tool_choice: a valid call (exists, right tool, JSON "
                        "arguments that satisfy the parameters schema) or finish_reason=length",
            "config": {"model": model, "calls_per_cell": calls, "clients": clients,
                       "max_seconds_per_cell": max_seconds_per_cell, "max_tokens": max_tokens,
                       "mix": MIX, "seed": seed, "serve_args": args, "base_url": base_url,
                       "cells": [{"temperature": t, "stream": s} for t, s in cells]},
            "complete": complete,  # False while cells are still running
            "cells": results,
            "violations_total": sum(sum(c["violations"].values()) for c in results),
            "model_root": root,
        }
        result["provenance"] = provenance.collect(model=root, threads=None)
        if out:
            atomic.write_json(out, result)
        return result

    try:
        try:
            root = httpx.get(base_url + "/v1/models", timeout=30, trust_env=False).json()["data"][0].get("root")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ToolStressError(f"{base_url}/v1/models: not a vLLM server answering "
                                  f"({type(exc).__name__}: {exc})") from None
        for temperature, stream in cells:
            cell = run_cell(base_url, temperature=temperature, stream=stream, calls=calls,
                            clients=clients, max_seconds=max_seconds_per_cell,
                            max_tokens=max_tokens, model=model, seed=seed)
            results.append(cell.summary())
            write(False, root)  # a slow host still leaves the finished cells behind
    finally:
        if proc is not None:
            soak.stop_server(proc)
    return write(True, root)
