"""`vllm-edge run`: load a model in vLLM with the plugin and answer one chat prompt.

Prints the answer, the ready time from process start (imports count), decode
tokens per second and peak RssAnon summed over the process tree. Unless ``verbose``,
the engine's own output goes to a log file (:mod:`engine_log`); conversion and
quantization progress bars, which come before it, stay on the terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from vllm_edge.common import timeline
from vllm_edge.common.procmem import TreeSampler, process_start_epoch
from vllm_edge.serving import engine_log

DEFAULT_PROMPT = "What is the capital of France?"
DEFAULT_SYSTEM = "You are a helpful assistant."
# Tokens per engine step in this process: sizes vLLM's start-up dummy forward (the largest
# phase of a warm start at vLLM's 4096, benchmarks/results/startup/); longer prompts chunk.
RUN_BATCH_TOKENS = 128
SPEC_PREFIX = "vllm:spec_decode_num_"


def system_message(model: str, given: str | None = None) -> tuple[str | None, str]:
    """The system message `run` sends for ``model`` and where it comes from: ``given`` (the
    ``--system`` flag; '' for none, None: not given) when set, else an embedded model's own
    (chosen by measurement, "" an empty system turn), else :data:`DEFAULT_SYSTEM`."""
    from vllm_edge.models import store

    if given is not None:
        return given or None, "--system"
    if model == "default" or model in store.MODELS:
        embedded = store.resolve_key(model)
        if embedded.system is not None:
            return embedded.system, f"{embedded.card_name}'s default in vllm-edge, measured: docs/guide/run.md"
    return DEFAULT_SYSTEM, "run's default"


def _histogram(metrics: list, name: str) -> tuple[int, float]:
    count, total = 0, 0.0
    for m in metrics:
        if m.name == name and hasattr(m, "count"):
            count += m.count
            total += m.sum
    return count, total


def spec_decode_counts(metrics: list) -> dict[str, int] | None:
    """vLLM's speculative-decoding counters (``drafts``, ``draft_tokens``, ``accepted_tokens``);
    None when the engine does not speculate."""
    counts = {}
    for m in metrics:
        if m.name.startswith(SPEC_PREFIX) and hasattr(m, "value"):
            key = m.name[len(SPEC_PREFIX):]
            counts[key] = counts.get(key, 0) + int(m.value)
    return counts or None


def run(model: str = "default", prompt: str = DEFAULT_PROMPT, system: str | None = DEFAULT_SYSTEM,
        max_tokens: int = 64, max_model_len: int = 2048, enforce_eager: bool = False,
        one_process: bool = True, as_json: bool = False, dtype: str = "auto",
        priority: str = "speed", images: list[str] | None = None,
        verbose: bool = True, tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1, speculative: str = "off") -> dict[str, Any]:
    from vllm_edge.models import vlm
    from vllm_edge.runtime import images as img_mod
    from vllm_edge.runtime import weight_path
    from vllm_edge.runtime.engine import edge_engine

    started = process_start_epoch()
    from vllm_edge.runtime import triton_hide

    triton_state = triton_hide.hide()  # before anything here imports torch
    images = list(images or [])
    # Every image is read, checked and decoded before any model work, so a bad file costs
    # no engine start (ImageInputError is a ValueError: the CLI prints it and exits 2).
    limits = img_mod.ImageLimits.from_env()
    loaded = [img_mod.load(src, limits) for src in images]
    if loaded and model == "default":
        model = vlm.KEY
        print(f"[vllm-edge] --image: using the embedded vision-language model {vlm.KEY} "
              "(docs/guide/multimodal.md)", file=sys.stderr)
    if loaded and vlm.parse_key(model) is None and not Path(model).is_dir():
        img_mod.check_count(len(loaded), limits, model=model, accepts_images=False)
    with timeline.phase("model resolution"):
        path, wpath = weight_path.model_for_engine(model, priority, dtype)
    img_mod.check_count(len(loaded), limits, model=str(path),
                        accepts_images=img_mod.model_accepts_images(path))
    # a fallback is never silent, quiet or not, even with -o json
    if verbose or wpath.fallback_from:
        for line in wpath.explain():
            print(f"[vllm-edge] {line}", file=sys.stderr)
    log = None if verbose else engine_log.new_path()
    quiet = engine_log.redirected(log) if log else contextlib.nullcontext(sys.stderr)
    with quiet as term, TreeSampler() as sampler:
        status(term, log, f"loading {Path(path).name}…")
        edge = edge_engine(path, max_model_len=max_model_len, enforce_eager=enforce_eager,
                           one_process=one_process, max_num_seqs=1,
                           max_num_batched_tokens=RUN_BATCH_TOKENS,
                           tensor_parallel_size=tensor_parallel_size,
                           pipeline_parallel_size=pipeline_parallel_size,
                           speculative=speculative, priority=priority)
        edge.reasons["max_num_seqs"] = ("1: `run` answers one conversation, so the KV cache is "
                                        "priced for one sequence at full length")
        template = None
        base = False
        if img_mod.model_accepts_images(path):
            edge.kwargs["limit_mm_per_prompt"] = {"image": limits.max_images}
        else:
            from vllm_edge.serving.serve import has_chat_template

            template = text_template(Path(path))
            base = not has_chat_template(Path(path))
        if template:
            edge.kwargs["chat_template"] = template
            edge.reasons["chat_template"] = (
                "the model's own template, given: else vLLM loads the tokenizer a second time "
                "(as an AutoProcessor) to look for a processor's template a text model lacks")
        edge.apply_env()
        if not as_json:
            if log:  # the choices are kept in the log
                for line in wpath.explain():
                    print(f"[vllm-edge] {line}", file=sys.stderr)
            print(f"[vllm-edge] model: {path}", file=sys.stderr)
            for line in edge.explain():
                print(f"[vllm-edge] {line}", file=sys.stderr)
        from vllm_edge.runtime import gc_freeze

        gc_freeze.hold_for_start()  # through the imports and the engine build
        try:
            t0 = time.time()
            with timeline.phase("import torch"):
                import torch  # noqa: F401  (vLLM imports it first thing; timed apart)
            with timeline.phase("import vllm"):
                from vllm import LLM, SamplingParams
            import_s = time.time() - t0
            timeline.install()  # before LLM(): its config step runs before the plugin loads
            with timeline.phase("LLM()"):
                llm = LLM(**edge.kwargs, disable_log_stats=False)
        finally:
            gc_freeze.end_start()
        ready_s = time.time() - started
        status(term, log, "")
        worker = llm.collective_rpc("vllm_edge_report")
        content: Any = prompt
        if loaded:
            content = [*({"type": "image_pil", "image_pil": li.image} for li in loaded),
                       {"type": "text", "text": prompt}]
        messages = [{"role": "user", "content": content}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        if base:
            from vllm_edge.serving.serve import BASE_MODEL_LINE

            print(f"[vllm-edge] {BASE_MODEL_LINE}", file=sys.stderr)
        t1 = time.time()
        if base:
            out = llm.generate(prompt, params, use_tqdm=False)[0]
        else:
            out = llm.chat(messages, params, use_tqdm=False, chat_template=template)[0]
        gen_s = time.time() - t1
        metrics = llm.get_metrics()
        answer = out.outputs[0].text
        n_tokens = len(out.outputs[0].token_ids)
        itl_n, itl_sum = _histogram(metrics, "vllm:inter_token_latency_seconds")
        ttft_n, ttft_sum = _histogram(metrics, "vllm:time_to_first_token_seconds")
        if ttft_n:
            timeline.record("first token", t1, t1 + ttft_sum / ttft_n)
        result = {
            "pid": os.getpid(),
            "model": str(path),
            "prompt": prompt,
            # a base model has no chat template: the prompt is completed as plain text
            "mode": "completion" if base else "chat",
            "images": [{"source": img_mod.describe(li.source), "format": li.format,
                        "width": li.width, "height": li.height, "bytes": li.nbytes} for li in loaded],
            "prompt_tokens": len(out.prompt_token_ids or []),
            "answer": answer,
            "generated_tokens": n_tokens,
            "token_ids": list(out.outputs[0].token_ids),
            "ready_s": round(ready_s, 3),
            "import_vllm_s": round(import_s, 3),
            "triton": triton_state,
            "generate_s": round(gen_s, 3),
            "ttft_s": round(ttft_sum / ttft_n, 4) if ttft_n else None,
            # vLLM times one inter-token gap per engine step, however many tokens the step
            # kept (several with speculative decoding): the rate is tokens after the first
            # over those gaps, not gaps per second
            "decode_tps": round((n_tokens - 1) / itl_sum, 2) if itl_n and itl_sum > 0 else None,
            "spec_decode": spec_decode_counts(metrics),
            "peak_tree_rss_anon_mb": None,
            "peak_processes": None,
            "worker": worker,
            "engine": edge.describe(),
            "weight_path": wpath.to_dict(),
            "log": str(log) if log else None,
        }
        del llm
    result["peak_tree_rss_anon_mb"] = round(sampler.peak_mb, 1)
    result["peak_processes"] = sampler.peak_procs
    return result


def text_template(model_path: Path) -> str | None:
    """The chat template a text model carries, when it is one template (not a named set)."""
    from vllm_edge.serving.serve import own_template

    try:
        text = own_template(model_path)
    except (OSError, ValueError):
        return None  # vLLM resolves it, and names what is wrong
    return text if text and not text.lstrip().startswith(("[", "{\"")) else None


def status(term: TextIO, log: Path | None, text: str) -> None:
    """A transient line on an interactive terminal while the engine loads (quiet mode)."""
    if log and term.isatty():
        term.write(f"\r\033[K{text}" + (f" (log: {log})" if text else ""))
        term.flush()


def print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        # One line, last: vLLM logs to stdout too, and harnesses read the last JSON line.
        print(json.dumps(result, default=str), flush=True)
        return
    print(result["answer"].strip())
    tps = f"{result['decode_tps']:.1f} tok/s" if result["decode_tps"] else "n/a"
    spec = result.get("spec_decode")
    accepted = (f" | speculative: {spec.get('accepted_tokens', 0)} of {spec.get('draft_tokens', 0)} "
                "proposed tokens kept" if spec else "")
    print(f"--- ready {result['ready_s']:.1f} s from process start | decode {tps} "
          f"({result['generated_tokens']} tokens){accepted} | peak RssAnon "
          f"{result['peak_tree_rss_anon_mb']:.0f} MB over {result['peak_processes']} processes")
    if result.get("log"):
        return  # quiet: the patch states are in the log, and in --verbose / -o json
    ranks = len(result["worker"])
    for rank, w in enumerate(result["worker"]):
        states = ", ".join(f"{k}={v}" for k, v in w["patches"].items())
        who = f"rank {rank} pid {w['pid']}" if ranks > 1 else f"worker pid {w['pid']}"
        print(f"{who}: patches {states}")
