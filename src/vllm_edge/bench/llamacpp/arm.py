"""The llama.cpp arm: `bench speed`'s metrics for a GGUF under llama-cpp-python.

Run it as its own process so its tree RssAnon is llama.cpp's alone::

    vllm-edge bench llamacpp --gguf model.Q4_K_M.gguf --threads 2

Same definitions as :mod:`speed` (it goes through :func:`speed.measure`):
pp = prompt tokens / time with 1 generated token; tg = (N-1) / (t_N - t_1).
Every call starts from an empty KV cache, so no prefix is reused. The last
stdout line is one JSON object with `bench speed`'s key names, so the command
works as a `vllm-edge grid` arm.

Batch throughput (``--batch B``): the B distinct prompts run as B sequences of
one llama.cpp context (:meth:`LlamaCppRunner.greedy_batch`: one ``llama_decode``
per step with one token per sequence), through the same tg difference as vLLM's
``b{B}_tg_tps``. That context (``n_seq_max`` = the largest B, ``n_ctx`` = B times
the single-sequence context, as vLLM prices its KV cache for max_num_seqs) is made
at load, beside the high-level object's; its KV cache counts in the memory phases.

Memory: llama.cpp mmaps the GGUF by default; those weight pages are file-backed
and not in RssAnon. ``rss_file_mb`` is reported beside it, and ``--no-mmap``
reads the weights into anonymous memory, as vLLM holds them.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from vllm_edge.bench import speed


def rss_file_mb(pid: int | None = None) -> float:
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def gguf_context_length(path: Path) -> int | None:
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    fld = r.fields.get(f"{arch}.context_length")
    return int(fld.contents()) if fld is not None else None


def llamacpp_generate(runner, json_schema: dict | None = None) -> speed.Generate:
    """Time one greedy run of ``max_tokens`` tokens per prompt, EOS ignored, from an
    empty cache; several prompts decode together as one batch. Under ``json_schema`` (one
    prompt at a time) every token goes through llama.cpp's grammar sampler."""
    grammar = None
    if json_schema is not None:
        import json

        from llama_cpp.llama_grammar import json_schema_to_gbnf

        grammar = json_schema_to_gbnf(json.dumps(json_schema))

    def generate(prompts: list[list[int]], max_tokens: int) -> float:
        if grammar is not None and len(prompts) != 1:
            raise speed.SpeedArgError("--json-schema: the llama.cpp arm constrains one sequence at a time")
        t0 = time.perf_counter()
        if grammar is not None:
            outs = [runner.greedy_constrained(prompts[0], max_tokens, grammar)]
        elif len(prompts) == 1:
            outs = [runner.greedy(prompts[0], max_tokens, eos=None)]
        else:
            outs = runner.greedy_batch(prompts, max_tokens)
        dt = time.perf_counter() - t0
        short = [len(o) for o in outs if len(o) != max_tokens]
        if short or len(outs) != len(prompts):
            raise RuntimeError(f"asked for {max_tokens} tokens x {len(prompts)} sequences, "
                               f"got {[len(o) for o in outs]}")
        return dt

    return generate


def build_label(path: Path, types: set[str], use_mmap: bool, json_schema: str | None = None) -> str:
    js = f", JSON schema {json_schema}" if json_schema else ""
    return f"{path.name} (llama.cpp {'/'.join(sorted(types))}{'' if use_mmap else ', no mmap'}{js})"


def run(gguf: str | os.PathLike, cfg: speed.SpeedConfig, *, pinning: dict | None = None,
        use_mmap: bool = True, out: str | os.PathLike | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    from vllm_edge.bench import prompts
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.common import atomic, provenance
    from vllm_edge.common.procmem import TreeSampler, tree_rss_anon_mb

    path = Path(gguf).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    n_ctx = speed.validate(cfg, gguf_context_length(path))
    max_seqs = max((1, *cfg.batches))
    types = llamacpp_runner.quantization_types(path)
    threads = (pinning or {}).get("threads") or cfg.threads or len(os.sched_getaffinity(0))

    memory: dict[str, float] = {}
    with TreeSampler(interval=0.05) as load_mem:
        t0 = time.perf_counter()
        import llama_cpp

        import_s = time.perf_counter() - t0
        limit = llamacpp_runner.max_parallel_sequences()
        if max_seqs > limit:
            raise speed.SpeedArgError(f"--batch {max_seqs}: llama.cpp decodes at most {limit} "
                                      "sequences in one context (llama_max_parallel_sequences)")
        runner = llamacpp_runner.LlamaCppRunner(path, n_ctx=n_ctx, threads=threads, use_mmap=use_mmap,
                                                max_seqs=max_seqs)
        load_s = time.perf_counter() - t0
    memory["load_peak_rss_anon_mb"] = round(load_mem.peak_mb, 1)
    memory["after_load_rss_anon_mb"] = round(tree_rss_anon_mb()[0], 1)
    file_mb = round(rss_file_mb(), 1)
    log(f"[llama.cpp] loaded in {load_s:.2f} s (import {import_s:.2f} s); {build_label(path, types, use_mmap, cfg.json_schema)}")

    source = speed.TokenSource(runner.llm.tokenize(prompts.corpus_text().encode(), add_bos=False))
    batch_context = runner.batch.describe() if runner.batch else None
    with TreeSampler(interval=0.5) as bench_mem:
        schema = speed.constraint_schema(cfg.json_schema) if cfg.json_schema else None
        measured = speed.measure(llamacpp_generate(runner, schema), cfg, source,
                                 log=lambda s: log(f"[llama.cpp] {s}"))
    memory["bench_peak_rss_anon_mb"] = round(bench_mem.peak_mb, 1)
    runner.close()

    result = {
        "benchmark": "speed",
        "engine": "llama.cpp",
        "build": build_label(path, types, use_mmap, cfg.json_schema),
        "model": str(path),
        "gguf_types": sorted(types),
        "config": {**asdict(cfg), "tg_prompt_len": speed.TG_PROMPT_LEN, "n_ctx": n_ctx,
                   "use_mmap": use_mmap, "n_threads": threads},
        "metrics": speed.summarize(measured["runs"]),
        "runs": measured["runs"],
        "batch_context": batch_context,
        "load_s": round(load_s, 3),
        "import_llama_cpp_s": round(import_s, 3),
        "memory_phases": memory,
        "rss_file_mb": file_mb,
        "timings": measured["timings"],
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "pinning": pinning,
        "provenance": provenance.collect(model=path, threads=threads,
                                         extra={"core_set_pinned": (pinning or {}).get("cores")}),
    }
    return atomic.write_result(out, result)


def metric_line(result: dict) -> dict:
    line = speed.metric_line(result)
    line.update({"engine": "llama.cpp", "rss_file_mb": result["rss_file_mb"],
                 "use_mmap": result["config"]["use_mmap"]})
    # which build ran, in the line a grid keeps: arms of one run may load different builds
    build = (result.get("provenance") or {}).get("llama_cpp") or {}
    if build:
        line["llama_cpp_build"] = {k: build.get(k) for k in ("ggml_commit", "amx_kernels", "cmake_args")}
    if "out" in line:  # keep "out" last, as bench speed does
        line["out"] = line.pop("out")
    return line
