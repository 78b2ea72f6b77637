"""`vllm-edge bench aot-cache`: cold start, then warm starts, on one VLLM_CACHE_ROOT.

Each start is a fresh `vllm-edge run -o json` process. We record vLLM's own
"init engine ... took" figure, our ready time from process start, what the log
says about the AOT artifact, and the worker's compilation counters (which
prove a warm start compiled nothing).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_edge.common import atomic, provenance
from vllm_edge.common.jsonline import last_json_line

DIRECT_LOAD = "Directly load AOT compilation"
LOAD_FAILURE = "Compiling model again due to a load failure"
SAVED = "saved AOT compiled function"
INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")


def parse_start_log(stderr: str) -> dict[str, Any]:
    m = INIT_RE.search(stderr)
    return {
        "init_engine_s": float(m.group(1)) if m else None,
        "direct_aot_load": DIRECT_LOAD in stderr,
        "aot_load_failure": LOAD_FAILURE in stderr,
        "aot_saved": SAVED in stderr,
        "load_failure_reasons": re.findall(rf"{LOAD_FAILURE} from \S+, reason: (.*)", stderr),
    }


def one_start(model: str, cache_root: Path, extra_env: dict[str, str] | None = None,
              timeout: float = 900, multiprocess: bool = True) -> dict[str, Any]:
    env = dict(os.environ, VLLM_CACHE_ROOT=str(cache_root))
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "vllm_edge.cli", "run", "-o", "json", "--model", model, "--max-tokens", "16"]
    if multiprocess:
        cmd.append("--multiprocess")
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t0
    rec: dict[str, Any] = {"wall_s": round(wall, 2), "returncode": proc.returncode}
    log = proc.stdout + proc.stderr  # vLLM logs to stdout
    rec.update(parse_start_log(log))
    if proc.returncode != 0:
        rec["stderr_tail"] = proc.stderr[-3000:]
        return rec
    out = last_json_line(proc.stdout)
    worker = out["worker"][0]
    counter = worker.get("compilation_counter") or {}
    rec.update({
        "ready_s": out["ready_s"],
        "answer": out["answer"],
        "main_pid": out["pid"],
        "worker_pid": worker["pid"],
        "worker_patches": worker["patches"],
        "aot_noop_attached": worker["aot_noop_attached"],
        "num_aot_compiles": counter.get("num_aot_compiles"),
        "num_inductor_compiles": counter.get("num_inductor_compiles"),
        "num_aot_artifacts_loaded": counter.get("num_aot_artifacts_loaded"),
        "peak_tree_rss_anon_mb": out["peak_tree_rss_anon_mb"],
    })
    return rec


def run(model: str = "default", starts: int = 3, out: str | None = None,
        cache_root: str | None = None, extra_env: dict[str, str] | None = None,
        unpatched: bool = True, multiprocess: bool = True) -> dict[str, Any]:
    """``starts`` patched starts (1 cold, then warm), then, if ``unpatched``, one more
    start on the same warm cache with the patch disabled: stock vLLM's behaviour."""
    if starts < 2:
        raise ValueError("need at least 2 starts: one cold, one warm")
    tmp = None
    if cache_root is None:
        tmp = tempfile.TemporaryDirectory(prefix="vllm-edge-aot-")
        cache_root = tmp.name
    root = Path(cache_root)
    records = []
    for i in range(starts):
        rec = one_start(model, root, extra_env, multiprocess=multiprocess)
        rec["start"], rec["kind"] = i, ("cold" if i == 0 else "warm")
        records.append(rec)
        print(f"[aot-cache] start {i} ({rec['kind']}): init {rec.get('init_engine_s')} s, "
              f"ready {rec.get('ready_s')} s, direct load {rec['direct_aot_load']}", file=sys.stderr)
    stock = None
    if unpatched:
        stock = one_start(model, root, {**(extra_env or {}), "VLLM_EDGE_PATCH_AOT_CACHE": "0"},
                          multiprocess=multiprocess)
        stock["start"], stock["kind"] = starts, "warm cache, patch disabled"
        print(f"[aot-cache] unpatched start: init {stock.get('init_engine_s')} s, "
              f"load failure {stock['aot_load_failure']}", file=sys.stderr)
    cold = records[0]
    warm = [r for r in records[1:] if r["returncode"] == 0]
    warm_init = [r["init_engine_s"] for r in warm if r["init_engine_s"] is not None]
    warm_ready = [r["ready_s"] for r in warm]
    summary = {
        "cold_init_engine_s": cold.get("init_engine_s"),
        "warm_init_engine_s_median": statistics.median(warm_init) if warm_init else None,
        "cold_ready_s": cold.get("ready_s"),
        "warm_ready_s_median": statistics.median(warm_ready) if warm_ready else None,
        "direct_load_on_warm_starts": bool(warm) and all(r["direct_aot_load"] for r in warm),
        "warm_starts_compiled_nothing": bool(warm) and all(
            r["num_aot_compiles"] == 0 and r["num_inductor_compiles"] == 0
            and r["num_aot_artifacts_loaded"] == 1 for r in warm
        ),
        "failed_starts": sum(r["returncode"] != 0 for r in records + ([stock] if stock else [])),
        "unpatched_init_engine_s": stock.get("init_engine_s") if stock else None,
        "unpatched_recompiled": stock["aot_load_failure"] if stock else None,
    }
    if stock:
        records.append(stock)
    if summary["cold_init_engine_s"] and summary["warm_init_engine_s_median"]:
        summary["init_ratio_warm_over_cold"] = round(
            summary["warm_init_engine_s_median"] / summary["cold_init_engine_s"], 3)
    if summary["cold_ready_s"] and summary["warm_ready_s_median"]:
        summary["ready_ratio_warm_over_cold"] = round(
            summary["warm_ready_s_median"] / summary["cold_ready_s"], 3)
    result = {
        "benchmark": "aot-cache",
        "summary": summary,
        "starts": records,
        "provenance": provenance.collect(model=_model_dir(model), extra={
            "cache_root": str(root), "executor": "multiprocess" if multiprocess else "one process"}),
    }
    if out:
        atomic.write_json(out, result)
    if tmp is not None:
        tmp.cleanup()
    return result


def _model_dir(model: str) -> str | None:
    from vllm_edge.models import store

    if model == "default" or model in store.MODELS:
        return str(store.prepared_dir(store.resolve_key(model)))
    return model
