"""`vllm-edge bench server`: the keep-alive server `run` starts, as a user meets it: wall time
from spawning it to the first token of an answer with warm caches, and its resident memory
per process once it has answered.

Each pass stops any server of the model, starts one through :func:`keepalive.ensure` (what
`run` does), streams one greedy answer (after `run`'s system message for the model; a plain
completion of the question for a base model without a chat template, as `run` asks it) and reads
RssAnon of every process in the server's tree: the API server, the engine core and, apart, the
gate's schema compiler when it lives (it exits when idle, so it is not part of the server's
resting size). Arms differ in extra vLLM flags and environment; passes rotate through the
arms so each sees the same host.

The first pass of each arm may pay a cold start (a new flag is a new compile-cache key): it is
reported apart from the warm passes whose medians count. A keep-alive server without a cached
graph answers eager and builds the graph in the background (:mod:`vllm_edge.serving.graph_cache`);
the first pass waits for that builder and records how long the graph took, so the warm passes
start compiled, as a user's next start does.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

PROMPT = "What is the capital of France?"
SETTLE_S = 2.0  # after the answer: let the allocator return what the request freed


def _first_token_s(rec, name: str, system: str | None, base: bool = False) -> tuple[float, str]:
    """Seconds from sending one chat request (``system``: run's system message, None for no
    system turn) to its first content token, and the answer. ``base``: the model has no chat
    template, so the request is a plain completion of the question, as `run` sends it."""
    import httpx

    messages = [{"role": "user", "content": PROMPT}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    body: dict[str, Any] = {"model": name, "max_tokens": 16, "temperature": 0, "stream": True}
    body.update({"prompt": PROMPT} if base else {"messages": messages})
    path = "/v1/completions" if base else "/v1/chat/completions"
    t0 = time.perf_counter()
    first, text = None, []
    with httpx.stream("POST", f"{rec.url}{path}", json=body, headers=rec.headers,
                      timeout=600, trust_env=False) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice.get("text") if base else choice.get("delta", {}).get("content")
            if delta:
                first = first if first is not None else time.perf_counter() - t0
                text.append(delta)
    return (first if first is not None else float("nan")), "".join(text)


def memory(root_pid: int) -> dict[str, Any]:
    """RssAnon in MB of each process of a server's tree (a child still sharing its parent's
    address space counted once, in the parent), keyed by role, the schema compiler apart."""
    from vllm_edge.common import procmem

    rows = []
    for pid, kb, shared in procmem.tree_rss_anon_kb(root_pid):
        if shared:
            continue
        cmd = procmem.cmdline(pid)
        role = ("api_server" if pid == root_pid else "schema_compiler" if "gate_compile" in cmd
                else "engine_core" if "EngineCore" in cmd or "VLLM" in cmd else "other")
        rows.append({"pid": pid, "role": role, "rss_anon_mb": round(kb / 1024, 1)})
    server = [r for r in rows if r["role"] != "schema_compiler"]
    return {"processes": rows, "server_rss_anon_mb": round(sum(r["rss_anon_mb"] for r in server), 1),
            "server_processes": len(server)}


def one_pass(model: str, extra: list[str], env: dict[str, str], enforce_eager: bool,
             options: dict[str, Any] | None = None, system: str | None = None) -> dict[str, Any]:
    """``system``: the system message sent before the question (run's, from :func:`run`)."""
    from vllm_edge.serving import keepalive

    key = keepalive.server_key(model, "auto")
    old = keepalive.find(key)
    if old is not None:
        keepalive.stop(old)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        t0 = time.perf_counter()
        rec, started = keepalive.ensure(model, "auto", 600, {"enforce_eager": enforce_eager, "extra": extra,
                                                             **(options or {})})
        ready_s = time.perf_counter() - t0
        if not started:
            raise RuntimeError(f"a server for {model} was running: stop it first")
        base = keepalive.serves_base_model(rec)
        ttft, answer = _first_token_s(rec, keepalive.served_name(rec), system, base)
        build = keepalive.served_build(rec)
        first_token_s = ready_s + ttft
        time.sleep(SETTLE_S)
        mem = memory(rec.pid)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    keepalive.stop(rec)
    return {"ready_s": round(ready_s, 2), "first_token_s": round(first_token_s, 2),
            "build": build, "request": "completion" if base else "chat", "answer": answer[:80],
            "loadavg": round(os.getloadavg()[0], 2), **mem}


def run(model: str = "default", *, arms: dict[str, dict[str, Any]], passes: int = 3,
        enforce_eager: bool = False, out: str | None = None,
        say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """``arms``: name -> {"extra": vLLM flags, "env": environment, "options": keywords of
    serve.main as `run` passes them}. ``passes`` warm passes per arm, after one pass each that
    may compile."""
    from vllm_edge.common import atomic, provenance
    from vllm_edge.serving import graph_cache
    from vllm_edge.serving.run import system_message

    system = system_message(model)[0]
    result: dict[str, Any] = {
        "benchmark": "server_start", "model": model, "prompt": PROMPT, "passes": passes,
        "what": "wall from spawning the keep-alive server (as `run` does) to the first token of a "
                "16-token greedy answer, and RssAnon per process 2 s after it; warm caches",
        "system": system,  # run's, sent before the question (None: no turn)
        "arms": {name: {**spec, "first_pass": None, "runs": []} for name, spec in arms.items()}}
    for name, spec in arms.items():  # one pass each to fill the compile cache for its flags
        say(f"{name}: first pass (may compile)")
        t0, since = time.perf_counter(), time.time()
        first = one_pass(model, spec.get("extra", []), spec.get("env", {}), enforce_eager,
                         spec.get("options"), system)
        first["graph_builds"] = graph_cache.wait_all(since)
        first["graph_ready_s"] = round(time.perf_counter() - t0, 2)
        result["arms"][name]["first_pass"] = first
    for i in range(passes):
        for name, spec in arms.items():
            row = one_pass(model, spec.get("extra", []), spec.get("env", {}), enforce_eager,
                           spec.get("options"), system)
            result["arms"][name]["runs"].append(row)
            say(f"{name} pass {i + 1}: first token {row['first_token_s']} s, server "
                f"{row['server_rss_anon_mb']} MB over {row['server_processes']} processes")
    for arm in result["arms"].values():
        runs = arm["runs"]
        arm["median"] = {k: round(statistics.median(r[k] for r in runs), 2)
                         for k in ("ready_s", "first_token_s", "server_rss_anon_mb")} if runs else {}
        arm["range"] = {k: [min(r[k] for r in runs), max(r[k] for r in runs)]
                        for k in ("first_token_s", "server_rss_anon_mb")} if runs else {}
    # the build the passes served (the same model argument may name another build later)
    result["build"] = next((r["build"] for a in result["arms"].values() for r in a["runs"] if r.get("build")),
                           None)
    result["provenance"] = provenance.collect(model=None, threads=None)
    if out:
        atomic.write_json(out, result)
    return result
