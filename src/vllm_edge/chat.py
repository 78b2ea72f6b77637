"""`vllm-edge run`: load a model in vLLM with the plugin and answer one chat prompt.

Prints the answer, the ready time from process start (imports count), decode
tokens per second and peak RssAnon summed over the process tree.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from vllm_edge.harness.procmem import TreeSampler, process_start_epoch

DEFAULT_PROMPT = "What is the capital of France?"
DEFAULT_SYSTEM = "You are a helpful assistant."


def _histogram(metrics: list, name: str) -> tuple[int, float]:
    count, total = 0, 0.0
    for m in metrics:
        if m.name == name and hasattr(m, "count"):
            count += m.count
            total += m.sum
    return count, total


def _model_path(model: str, scheme: str | None = None, group: int | None = None):
    """Resolve the model; a first-use conversion (and quantization, when ``scheme`` is
    given) runs in a child process, so its memory never counts in this process's RssAnon
    (its time counts in ready_s)."""
    import subprocess
    from pathlib import Path

    from vllm_edge.models import default, vlm

    parsed = vlm.parse_key(model)
    if parsed:
        # a named build (smolvlm-135m-cpu_int4-g64[-vision]) runs as named; the bare key
        # takes the scheme chosen by the caller
        vision = parsed[2]
        if parsed[0]:
            scheme, group = parsed[0], parsed[1]
        ok = vlm.ready(scheme, group or 64, vision) if scheme else vlm.ready()
        if not ok:
            default.source_gguf(default.resolve_key("default"))
            cmd = [sys.executable, "-m", "vllm_edge.cli", "models", "build-vlm"]
            if scheme:
                cmd += ["--quant", scheme, "--group", str(group or 64),
                        "--quantize-vision" if vision else "--no-quantize-vision"]
            subprocess.run(cmd, check=True)
        return vlm.quantized_dir(scheme, group or 64, vision) if scheme else vlm.prepared_dir()
    if (model == "default" or model in default.MODELS) and scheme:
        target = default.quantized_dir(default.resolve_key(model), scheme, group)
        if not default.quantized_ready(model, scheme, group):
            default.source_gguf(default.resolve_key(model))
            subprocess.run([sys.executable, "-m", "vllm_edge.cli", "models", "prepare", model,
                            "--quant", scheme, "--group", str(group)], check=True)
        return target
    if model == "default" or model in default.MODELS:
        target = default.prepared_dir(default.resolve_key(model))
        if not (target / default.MANIFEST_NAME).exists():
            default.source_gguf(default.resolve_key(model))  # clear error if the package is missing
            subprocess.run([sys.executable, "-m", "vllm_edge.cli", "models", "prepare", model], check=True)
        return target
    return default.resolve_model_path(model)


def run(model: str = "default", prompt: str = DEFAULT_PROMPT, system: str | None = DEFAULT_SYSTEM,
        max_tokens: int = 64, max_model_len: int = 2048, enforce_eager: bool = False,
        one_process: bool = True, as_json: bool = False, dtype: str = "auto",
        priority: str = "speed", images: list[str] | None = None) -> dict[str, Any]:
    from vllm_edge.models import default, vlm
    from vllm_edge.runtime import hw, weight_path
    from vllm_edge.runtime import images as img_mod
    from vllm_edge.runtime.engine import edge_engine

    started = process_start_epoch()
    images = list(images or [])
    # Every image is read, checked and decoded before any model work, so a bad file costs
    # no engine start (ImageInputError is a ValueError: the CLI prints it and exits 2).
    limits = img_mod.ImageLimits.from_env()
    loaded = [img_mod.load(src, limits) for src in images]
    if loaded and model == "default":
        model = vlm.KEY
        print(f"[vllm-edge] --image: using the embedded vision-language model {vlm.KEY} "
              "(docs/multimodal.md)", file=sys.stderr)
    if model == vlm.KEY:
        wpath = weight_path.for_run(hw.profile(), priority, dtype)
        if wpath.scheme not in (None, "cpu_int4"):
            wpath = weight_path.WeightPath(
                "cpu_int4", wpath.reasons + [f"{vlm.KEY} has no {wpath.name} build; using cpu_int4"],
                fallback_from=wpath.name)
        img_mod.check_count(len(loaded), limits, model=model)
        path = _model_path(model, wpath.scheme, wpath.group)
    elif model == "default" or model in default.MODELS:
        wpath = weight_path.for_run(hw.profile(), priority, dtype)
        img_mod.check_count(len(loaded), limits, model=model, accepts_images=False)
        path = _model_path(model, wpath.scheme, wpath.group)
    else:
        path = _model_path(model)
        img_mod.check_count(len(loaded), limits, model=str(path),
                            accepts_images=img_mod.model_accepts_images(path))
        wpath = weight_path.for_checkpoint(path)
    # always on stderr, even with --json: a fallback is never silent
    tag = "" if wpath.verified else " (unverified)"
    print(f"[vllm-edge] weight path: {wpath.name}{tag}", file=sys.stderr)
    for why in wpath.reasons:
        print(f"[vllm-edge]   - {why}", file=sys.stderr)
    with TreeSampler() as sampler:
        edge = edge_engine(path, max_model_len=max_model_len, enforce_eager=enforce_eager,
                           one_process=one_process)
        if img_mod.model_accepts_images(path):
            edge.kwargs["limit_mm_per_prompt"] = {"image": limits.max_images}
        edge.apply_env()
        if not as_json:
            print(f"[vllm-edge] model: {path}", file=sys.stderr)
            for key, why in edge.reasons.items():
                value = edge.kwargs.get(key, edge.env.get(key))
                print(f"[vllm-edge] {key}={value}: {why}", file=sys.stderr)
        t0 = time.time()
        from vllm import LLM, SamplingParams

        import_s = time.time() - t0
        llm = LLM(**edge.kwargs, disable_log_stats=False)
        ready_s = time.time() - started
        worker = llm.collective_rpc("vllm_edge_report")
        content: Any = prompt
        if loaded:
            content = [*({"type": "image_pil", "image_pil": li.image} for li in loaded),
                       {"type": "text", "text": prompt}]
        messages = [{"role": "user", "content": content}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        t1 = time.time()
        out = llm.chat(messages, params, use_tqdm=False)[0]
        gen_s = time.time() - t1
        metrics = llm.get_metrics()
        answer = out.outputs[0].text
        n_tokens = len(out.outputs[0].token_ids)
        itl_n, itl_sum = _histogram(metrics, "vllm:inter_token_latency_seconds")
        ttft_n, ttft_sum = _histogram(metrics, "vllm:time_to_first_token_seconds")
        result = {
            "pid": os.getpid(),
            "model": str(path),
            "prompt": prompt,
            "images": [{"source": img_mod.describe(li.source), "format": li.format,
                        "width": li.width, "height": li.height, "bytes": li.nbytes} for li in loaded],
            "prompt_tokens": len(out.prompt_token_ids or []),
            "answer": answer,
            "generated_tokens": n_tokens,
            "token_ids": list(out.outputs[0].token_ids),
            "ready_s": round(ready_s, 3),
            "import_vllm_s": round(import_s, 3),
            "generate_s": round(gen_s, 3),
            "ttft_s": round(ttft_sum / ttft_n, 4) if ttft_n else None,
            "decode_tps": round(itl_n / itl_sum, 2) if itl_sum > 0 else None,
            "peak_tree_rss_anon_mb": None,
            "peak_processes": None,
            "worker": worker,
            "engine": edge.describe(),
            "weight_path": wpath.to_dict(),
        }
        del llm
    result["peak_tree_rss_anon_mb"] = round(sampler.peak_mb, 1)
    result["peak_processes"] = sampler.peak_procs
    return result


def print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        # One line, last: vLLM logs to stdout too, and harnesses read the last JSON line.
        print(json.dumps(result, default=str), flush=True)
        return
    print(result["answer"].strip())
    print("---")
    tps = f"{result['decode_tps']:.1f} tok/s" if result["decode_tps"] else "n/a"
    print(f"ready {result['ready_s']:.1f} s from process start | decode {tps} "
          f"({result['generated_tokens']} tokens) | peak RssAnon {result['peak_tree_rss_anon_mb']:.0f} MB "
          f"over {result['peak_processes']} processes")
    for w in result["worker"]:
        states = ", ".join(f"{k}={v}" for k, v in w["patches"].items())
        print(f"worker pid {w['pid']}: patches {states}")
