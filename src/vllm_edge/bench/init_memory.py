"""`vllm-edge bench init-memory`: start-up time and tree RssAnon by phase.

Each rep is a fresh child process, so ``ready_s`` (from the kernel's process
start time) includes interpreter start-up and imports. Inside it a sampler
thread reads RssAnon of the whole process tree every 20 ms, rescanning
children, and phase marks record the tree at:

before_import, after_import, after_engine, after_release, after_generate,
after_fill (a prompt of ``--context-len`` tokens fills the KV cache).

The child (`vllm-edge bench init-memory --child`) has switches that turn single levers off (``--multiprocess``,
``--kv-gib N`` for vLLM's whole-GiB sizing instead of the priced budget,
``--no-release``), so a grid can show each lever's share; with the patch
switches and ``VLLM_PLUGINS=""`` in the arm's environment it also runs stock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from vllm_edge.common import atomic, provenance
from vllm_edge.common.errors import UsageError
from vllm_edge.common.jsonline import last_json_line

PHASES = ("before_import", "after_import", "after_engine", "after_release",
          "after_generate", "after_fill")


def child(model: str, max_model_len: int = 2048, context_len: int = 1024, multiprocess: bool = False,
          enforce_eager: bool = False, kv_gib: int | None = None, release: bool = True) -> int:
    """One rep, in this (fresh) process: `vllm-edge bench init-memory --child ...`. Prints one
    JSON line. ``kv_gib`` sizes the KV cache as stock vLLM does (VLLM_CPU_KVCACHE_SPACE=N GiB);
    ``release=False`` does not ask the worker to trim arenas."""
    from types import SimpleNamespace

    from vllm_edge.common.procmem import TreeSampler, process_start_epoch, tree_rss_anon_mb

    a = SimpleNamespace(model=model, max_model_len=max_model_len, context_len=context_len,
                        multiprocess=multiprocess, enforce_eager=enforce_eager, kv_gib=kv_gib,
                        no_release=not release)
    if not os.path.isdir(a.model):
        from vllm_edge.models.resolver import ensure_model

        a.model = str(ensure_model(a.model))

    started = process_start_epoch()
    marks: list[dict[str, Any]] = []
    with TreeSampler(keep_samples=True) as sampler:
        def mark(name: str) -> None:
            mb, n = tree_rss_anon_mb()
            marks.append({"phase": name, "t_s": round(time.time() - started, 3),
                          "tree_rss_anon_mb": round(mb, 1), "processes": n})

        mark("before_import")
        from vllm_edge.runtime.engine import edge_engine

        edge = edge_engine(a.model, max_model_len=a.max_model_len, enforce_eager=a.enforce_eager,
                           one_process=not a.multiprocess, max_num_seqs=1,
                           enable_prefix_caching=False)
        if a.kv_gib is not None:
            # Stock sizing: no explicit budget, vLLM's own env in whole GiB.
            del edge.kwargs["kv_cache_memory_bytes"]
            edge.env["VLLM_CPU_KVCACHE_SPACE"] = str(a.kv_gib)
            edge.reasons["kv_cache_memory_bytes"] = f"stock: VLLM_CPU_KVCACHE_SPACE={a.kv_gib} GiB"
        edge.apply_env()
        t0 = time.time()
        from vllm import LLM, SamplingParams

        import_s = time.time() - t0
        mark("after_import")
        t1 = time.time()
        llm = LLM(**edge.kwargs)
        init_s = time.time() - t1
        ready_s = time.time() - started
        mark("after_engine")
        releases = (None if a.no_release
                    else llm.collective_rpc("vllm_edge_release", args=("bench",)))
        mark("after_release")
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        llm.generate(["The capital of France is"], params, use_tqdm=False)
        mark("after_generate")
        ids = list(range(1000, 1000 + a.context_len - 8))
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        mark("after_fill")
        worker = llm.collective_rpc("vllm_edge_report")
        del llm
    settled = next(m for m in marks if m["phase"] == "after_release")
    filled = next(m for m in marks if m["phase"] == "after_fill")
    print(json.dumps({
        "ready_s": round(ready_s, 3), "import_s": round(import_s, 3), "init_s": round(init_s, 3),
        "peak_tree_rss_anon_mb": round(sampler.peak_mb, 1), "peak_processes": sampler.peak_procs,
        "settled_tree_rss_anon_mb": settled["tree_rss_anon_mb"],
        "filled_tree_rss_anon_mb": filled["tree_rss_anon_mb"],
        "phases": marks, "releases": releases, "worker": worker, "engine": edge.describe(),
    }), flush=True)
    return 0


def run(model: str = "default", reps: int = 1, context_len: int = 1024, max_model_len: int = 2048,
        multiprocess: bool = False, enforce_eager: bool = False, out: str | None = None,
        extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    if context_len > max_model_len:
        raise UsageError(f"--context-len {context_len} is larger than --max-model-len {max_model_len}")
    from vllm_edge.models.resolver import ensure_model

    path = ensure_model(model)
    prov = provenance.collect(model=path, extra={"bench": "init-memory"})
    records = []
    for rep in range(reps):
        cmd = [sys.executable, "-m", "vllm_edge.cli", "bench", "init-memory", "--child", "--model", str(path),
               "--max-model-len", str(max_model_len), "--context-len", str(context_len)]
        if multiprocess:
            cmd.append("--multiprocess")
        if enforce_eager:
            cmd.append("--enforce-eager")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                              env={**os.environ, **(extra_env or {})})
        rec: dict[str, Any] = {"rep": rep, "returncode": proc.returncode,
                               "mode": "multiprocess" if multiprocess else "one-process",
                               "context_len": context_len}
        if proc.returncode == 0:
            rec.update(last_json_line(proc.stdout))
        else:
            rec["stderr_tail"] = proc.stderr[-3000:]
        records.append(rec)
        print(f"[init-memory] rep {rep} ({rec['mode']}): ready {rec.get('ready_s')} s, peak "
              f"{rec.get('peak_tree_rss_anon_mb')} MB, settled {rec.get('settled_tree_rss_anon_mb')} MB",
              file=sys.stderr)
    if out:
        atomic.append_jsonl(out, [{"provenance": prov}] + records)
    return records

