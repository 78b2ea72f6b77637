"""From process start to first token, phase by phase: `vllm-edge run --keep-alive 0`.

Each pass spawns `vllm-edge run --keep-alive 0 --prompt ... -o json` in a fresh interpreter
with ``VLLM_EDGE_TIMELINE`` set, so the run and the engine record their phases
(:mod:`vllm_edge.common.timeline`): interpreter start-up, our CLI and model resolution,
``import torch``, ``import vllm``, then inside ``LLM()`` vLLM's own steps (engine config, HF
config reads, tokenizer loads, device init, model init, weights read and post-processing,
the compile warm-up run with its AOT artifact load, KV allocation, structured-output init),
then the first token. One unmeasured run first warms the compile cache and the page cache,
so every pass is the warm start a user sees from the second run on. Offsets are from the
process's start (from ``/proc``), medians over passes; each phase also carries its call
count (a config read twice shows as 2) and the process's RssAnon when it ended, which makes
the timeline a memory ledger of the start too.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_edge.common import timeline
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.jsonline import last_json_line

PROMPT = "What is the capital of France?"
# The phases of one pass in the order they start; others (a new target) follow by time.
ORDER = ("interpreter", "model resolution", "import torch", "import vllm", "LLM()",
         "engine config", "hf config read", "tokenizer load", "engine core", "device init",
         "model load", "model init", "weights read", "weights post-processing", "memory profile",
         "compile warm-up run", "AOT artifact load", "C++ header precompile", "vector ISA probe", "KV allocation", "warm-up",
         "structured output init", "first token")


class StartupError(EdgeError, RuntimeError):
    """A `bench startup` pass that failed: the run exited, or an arm cannot import vllm_edge."""


def one_pass(model: str, *, max_tokens: int, run_flags: list[str], env: dict[str, str],
             timeout_s: float = 900) -> dict[str, Any]:
    """One `run` in a fresh process: its JSON result and its timeline records."""
    with tempfile.TemporaryDirectory(prefix="vllm-edge-startup-") as tmp:
        tl = Path(tmp) / "timeline.jsonl"
        argv = [sys.executable, "-m", "vllm_edge.cli", "run", "--model", model, "--keep-alive", "0",
                "--prompt", PROMPT, "--max-tokens", str(max_tokens), "-o", "json", *run_flags]
        t0 = time.time()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **env, "VLLM_EDGE_TIMELINE": str(tl)})
        wall = time.time() - t0
        try:
            if proc.returncode != 0:
                raise ValueError
            result = last_json_line(proc.stdout)
        except ValueError:
            raise StartupError(f"`{' '.join(argv[2:])}` exited {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout)[-800:]}") from None
        records = timeline.read(tl) if tl.exists() else []
    return {"result": result, "records": records, "wall_s": round(wall, 3)}


def arm_source(env: dict[str, str]) -> dict[str, str | None]:
    """Which vllm_edge an arm runs (its ``PYTHONPATH`` may point at another checkout) and the
    commit that checkout is at."""
    from vllm_edge.common.provenance import repo_sha

    proc = subprocess.run([sys.executable, "-c", "import vllm_edge; print(vllm_edge.__file__)"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    if proc.returncode != 0:
        raise StartupError(f"arm environment {env}: cannot import vllm_edge: {proc.stderr[-400:]}")
    where = Path(proc.stdout.strip().splitlines()[-1]).parent
    return {"path": str(where), "git": repo_sha(where)}


def phases(records: list[dict]) -> dict[str, dict[str, Any]]:
    """Per phase name: offset of its first start from process start, summed duration, calls
    and the RssAnon (MB) at its last end; plus the gap in ``LLM()`` no phase covers."""
    start = next((r["start"] for r in records if r["name"] == "interpreter"), None)
    if start is None:
        raise StartupError("the timeline has no 'interpreter' record: was it `vllm-edge run`?")
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["start"]):
        p = out.setdefault(r["name"], {"offset_s": round(r["start"] - start, 3), "seconds": 0.0,
                                       "calls": 0, "rss_anon_mb": None, "pids": []})
        p["seconds"] = round(p["seconds"] + r["end"] - r["start"], 3)
        p["calls"] += 1
        if r.get("rss_anon_kb") is not None:
            p["rss_anon_mb"] = round(r["rss_anon_kb"] / 1024, 1)
        if r["pid"] not in p["pids"]:
            p["pids"].append(r["pid"])
    llm = next((r for r in records if r["name"] == "LLM()"), None)
    if llm:
        top = [r for r in records if r["name"] in ("engine config", "engine core")
               and llm["start"] <= r["start"] and r["end"] <= llm["end"]]
        covered = sum(r["end"] - r["start"] for r in top)
        out["LLM() other"] = {"offset_s": None, "seconds": round(llm["end"] - llm["start"] - covered, 3),
                              "calls": 1, "rss_anon_mb": None, "pids": [llm["pid"]]}
    first = next((r for r in records if r["name"] == "first token"), None)
    if first:
        out["first token"]["from_start_s"] = round(first["end"] - start, 3)
    return out


def _order(name: str) -> tuple[int, str]:
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def _median(vals: list) -> float | None:
    """None when there is nothing to take a median of, or a pass lacks the value."""
    return round(statistics.median(vals), 3) if vals and None not in vals else None


def summarize(passes: list[dict]) -> dict[str, Any]:
    per = [phases(p["records"]) for p in passes]
    names = sorted({n for ph in per for n in ph}, key=_order)
    table = {}
    for n in names:
        rows = [ph[n] for ph in per if n in ph]
        table[n] = {"seconds_median": _median([r["seconds"] for r in rows]),
                    "seconds_min": min(r["seconds"] for r in rows),
                    "seconds_max": max(r["seconds"] for r in rows),
                    "offset_s_median": _median([r["offset_s"] for r in rows]),
                    "calls": sorted({r["calls"] for r in rows}),
                    "rss_anon_mb_median": _median([r["rss_anon_mb"] for r in rows]),
                    "passes": len(rows)}
    res = [p["result"] for p in passes]
    first = [ph["first token"]["from_start_s"] for ph in per if "first token" in ph]

    return {
        "ready_s_median": _median([r["ready_s"] for r in res]),
        "first_token_from_start_s_median": _median(first),
        "wall_s_median": _median([p["wall_s"] for p in passes]),
        "peak_tree_rss_anon_mb_median": _median([r["peak_tree_rss_anon_mb"] for r in res]),
        "peak_processes": sorted({r["peak_processes"] for r in res}),
        "phases": table,
    }


def run(model: str = "default", *, passes: int = 5, arms: dict[str, dict[str, str]] | None = None,
        max_tokens: int = 8, run_flags: list[str] | None = None, out: str | None = None,
        progress: bool = True) -> dict[str, Any]:
    """``arms``: label -> extra environment (an A/B of one lever, or ``PYTHONPATH`` of another
    checkout); passes rotate the arms' order, so each arm sees the same host."""
    from tqdm import tqdm

    from vllm_edge.common import atomic, provenance

    run_flags, arms = list(run_flags or []), dict(arms or {"default": {}})
    labels = list(arms)
    prime = {a: one_pass(model, max_tokens=max_tokens, run_flags=run_flags, env=arms[a]) for a in labels}
    done: dict[str, list[dict]] = {a: [] for a in labels}
    with tqdm(total=passes * len(labels), desc="startup", unit="run", disable=not progress,
              file=sys.stderr) as bar:
        for i in range(passes):
            for a in labels[i % len(labels):] + labels[:i % len(labels)]:
                p = one_pass(model, max_tokens=max_tokens, run_flags=run_flags, env=arms[a])
                p["loadavg"] = os.getloadavg()[0]
                p["pass"] = i
                done[a].append(p)
                bar.set_postfix_str(f"{a} ready {p['result']['ready_s']:.1f}s")
                bar.update(1)
    result = {
        "benchmark": "startup",
        "what": "warm `vllm-edge run --keep-alive 0 --prompt` (in-process engine), phases from "
                "process start to first token; medians over passes after one unmeasured run per "
                "arm, arms rotated each pass",
        "model": model, "passes": passes, "max_tokens": max_tokens, "run_flags": run_flags,
        "targets": {"ready_s": 8.0, "peak_tree_rss_anon_mb": 600.0},
        "arms": {},
        "provenance": provenance.collect(model=None, threads=None),
    }
    for a in labels:
        arm = {"env": arms[a], "source": arm_source(arms[a]), **summarize(done[a]),
               "prime": {"ready_s": prime[a]["result"]["ready_s"], "wall_s": prime[a]["wall_s"]},
               "runs": [{"pass": p["pass"], "wall_s": p["wall_s"], "loadavg": p["loadavg"],
                         "result": {k: p["result"].get(k) for k in (
                             "ready_s", "import_vllm_s", "ttft_s", "decode_tps", "peak_tree_rss_anon_mb",
                             "peak_processes", "answer", "model")},
                         "records": p["records"]} for p in done[a]]}
        arm["met"] = {"ready_s": (arm["ready_s_median"] or 1e9) <= 8.0,
                      "peak_tree_rss_anon_mb": (arm["peak_tree_rss_anon_mb_median"] or 1e9) <= 600.0}
        result["arms"][a] = arm
    if out:
        atomic.write_json(out, result)
    return result


def format_table(result: dict[str, Any]) -> str:
    """One arm's phases as text: offset from process start, seconds (min-max), calls, RssAnon."""
    rows = [f"{'phase':<20} {'at (s)':>7} {'seconds':>8} {'min-max':>13} {'calls':>6} {'RssAnon MB':>10}"]
    for name, p in result["phases"].items():
        at = "" if p["offset_s_median"] is None else f"{p['offset_s_median']:.2f}"
        rss = "" if p["rss_anon_mb_median"] is None else f"{p['rss_anon_mb_median']:.0f}"
        rows.append(f"{name:<20} {at:>7} {p['seconds_median']:>8.2f} "
                    f"{p['seconds_min']:>6.2f}-{p['seconds_max']:<6.2f} "
                    f"{','.join(map(str, p['calls'])):>6} {rss:>10}")
    rows.append(f"ready {result['ready_s_median']} s, first token {result['first_token_from_start_s_median']} s "
                f"from process start, peak tree RssAnon {result['peak_tree_rss_anon_mb_median']} MB "
                f"over {result['peak_processes']} processes")
    return "\n".join(rows)
