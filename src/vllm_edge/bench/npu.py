"""The NPU export's fidelity and placement: ``benchmarks/results/npu/export.json``.

Exports the model three times (``w8a16``, the QNN form; ``w8a8`` and ``float`` as bounds),
compiles the w8a16 graphs for Qualcomm's HTP through onnxruntime-qnn (the context binaries and
which nodes land on the HTP), and scores each export teacher-forced against the bf16 model's
logits (transformers ``LlamaForCausalLM`` in float32 on the bf16 weights): top-1 agreement and
KL(reference || export) per position, the first half of each prompt through the prefill graph,
the rest through the decode graph, as a phone app runs them. The w8a16 graphs are scored on the
HTP's x86 emulation when it runs here within the time budget, otherwise on onnxruntime's CPU
provider (the same QDQ graph), and ``ran_on`` says which.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vllm_edge.common import atomic, provenance
from vllm_edge.common.errors import EdgeError

TARGETS = {"top1": 0.95, "kl": 0.02}
NO_SINK = "w8a16-no-sink"
CHAT_PROMPTS = 4


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Teacher-forced top-1 agreement and mean KL(ref || got) over positions."""
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return {"top1": float((ref.argmax(-1) == got.argmax(-1)).mean()), "kl": float(kl.mean()),
            "positions": int(len(kl))}


def check(score: dict[str, float], targets: dict[str, float] = TARGETS) -> list[str]:
    """What misses the targets (empty when the export passes)."""
    misses = []
    if score["top1"] < targets["top1"]:
        misses.append(f"top-1 {score['top1']:.3f} < {targets['top1']}")
    if score["kl"] > targets["kl"]:
        misses.append(f"KL {score['kl']:.4f} > {targets['kl']}")
    return misses


def fidelity_token_lists(tokenizer, limit: int) -> list[list[int]]:
    """The chat fidelity prompts (none is a calibration prompt), in the chat template, cut to fit."""
    from vllm_edge.bench.prompts import fidelity_prompts

    out = []
    for p in [p for p in fidelity_prompts() if p["kind"] == "chat"][:CHAT_PROMPTS]:
        ids = tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append(list(ids)[:limit])
    return out


def reference_logits(src: Path, token_lists: list[list[int]]) -> list[np.ndarray]:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].numpy() for ids in token_lists]


def score_export(out: Path, token_lists, refs, sessions: Callable[[Path], tuple]) -> dict[str, Any]:
    """Top-1 and KL of the export in ``out`` against ``refs``, per prompt and pooled, over the
    positions after the first: an export with an attention sink never runs position 0 (its
    next token follows the fixed first token, so no app asks for it), and scoring every export
    on the same positions keeps them comparable."""
    from vllm_edge.common import manifest
    from vllm_edge.models.npu import runner, sink as sinks

    m = manifest.read(out)
    sink = sinks.load(out, m)
    s = m["shapes"]
    shape = runner.CacheShape(s["n_layer"], s["n_kv_heads"], s["head_dim"], s["context"])
    prefill, decode = sessions(out)
    per, got_all, ref_all = [], [], []
    t0 = time.time()
    for ids, ref in zip(token_lists, refs):
        got = runner.run(ids, shape, runner.ort_graph(prefill), s["prefill"], runner.ort_graph(decode),
                         n_prefill=len(ids) // 2, sink=sink)
        got, ref = (got if sink is not None else got[1:]), ref[1:]
        per.append(compare(ref, got))
        got_all.append(got)
        ref_all.append(ref)
    pooled = compare(np.concatenate(ref_all), np.concatenate(got_all))
    return {**pooled, "per_prompt": per, "seconds": round(time.time() - t0, 1)}


def cpu_sessions(out: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return tuple(ort.InferenceSession(str(out / f"{g}.onnx"), so, providers=["CPUExecutionProvider"])
                 for g in ("prefill", "decode"))


def htp_sessions(ctx_dir: Path):
    from vllm_edge.models.npu import qnn

    return lambda _out: tuple(qnn.session(ctx_dir / f"{g}_ctx.onnx", strict=True) for g in ("prefill", "decode"))


def default_out() -> Path:
    """This host's artifact: ``benchmarks/results/npu/<host>.json`` (one file per host, so a
    run never replaces another host's)."""
    from vllm_edge.bench.compare import host_artifact

    return host_artifact("benchmarks/results/npu")


def run(model: str = "default", *, context: int = 128, prefill: int = 32, calibration_limit: int | None = None,
        htp_budget: float = 900.0, out: str | Path | None = None,
        keep: str | Path | None = None, sink: str = "auto") -> dict[str, Any]:
    """Export, compile, score; writes the artifact to ``out`` (default :func:`default_out`).
    ``keep`` keeps the w8a16 build (with its compiled ``qnn/`` folder) at that path. With a
    sink (``auto`` finds one), a w8a16 export without it is scored beside the others: the
    sink's effect in one run."""
    from transformers import AutoTokenizer

    from vllm_edge.common import manifest
    from vllm_edge.models.npu import qnn, sink as sinks
    from vllm_edge.models.npu.export import export_npu, resolve_source

    src = resolve_source(model)
    tok = AutoTokenizer.from_pretrained(str(src))
    token_lists = fidelity_token_lists(tok, context - 1)
    refs = reference_logits(src, token_lists)
    work = Path(tempfile.mkdtemp(prefix="vllm-edge-npu-bench."))
    try:
        builds, times = {}, {}
        arms = [(p, p, sink) for p in ("w8a16", "w8a8", "float")]
        if sink == "auto" and sinks.first_token(tok)[0] is not None:
            arms.append((NO_SINK, "w8a16", "off"))
        for name, precision, arm_sink in arms:
            t0 = time.time()
            builds[name] = export_npu(model, work / name, context=context, prefill=prefill,
                                      precision=precision, calibration_limit=calibration_limit,
                                      sink=arm_sink, progress=False)
            times[name] = round(time.time() - t0, 1)
        w8 = builds["w8a16"]
        w8_manifest = manifest.read(w8)
        ctx_dir = w8 / "qnn"
        ctx_dir.mkdir()
        compiled = {g: qnn.compile_graph(w8 / f"{g}.onnx", ctx_dir / f"{g}_ctx.onnx") for g in ("prefill", "decode")}
        cpu = {p: score_export(b, token_lists, refs, cpu_sessions) for p, b in builds.items()}
        htp: dict[str, Any] = {"ran": False}
        if all(c.get("compiled") and c.get("strict") for c in compiled.values()):
            t0 = time.time()
            try:
                first = score_export(w8, token_lists[:1], refs[:1], htp_sessions(ctx_dir))
                htp = {"ran": True, "first_prompt": first, "first_prompt_seconds": first["seconds"]}
                if first["seconds"] * len(token_lists) <= htp_budget:
                    htp["all"] = score_export(w8, token_lists, refs, htp_sessions(ctx_dir))
            except Exception as exc:  # the emulation's refusal is the finding
                htp = {"ran": False, "error": str(exc).strip()[:2000]}
            htp["seconds"] = round(time.time() - t0, 1)
        headline = htp.get("all") or cpu["w8a16"]
        ran_on = "qnn-htp-emulation" if "all" in htp else "ort-cpu"
        nodes = sum(c.get("nodes", 0) for c in compiled.values())
        off = sum(c.get("nodes_off_htp", 0) for c in compiled.values())
        binary: Any = (f"qnn/{compiled['decode']['context_binaries'][0]}"
                       if compiled["decode"].get("compiled") else False)
        result = {
            "model": str(model), "context": context, "prefill": prefill,
            "reference": "transformers LlamaForCausalLM, float32 compute on the bf16 weights, CPU",
            "targets": TARGETS,
            "top1": round(headline["top1"], 4), "kl": round(headline["kl"], 5),
            "passes": not check(headline), "misses": check(headline), "ran_on": ran_on,
            "bounds": {p: {"top1": round(cpu[p]["top1"], 4), "kl": round(cpu[p]["kl"], 5)}
                       for p in ("w8a8", "float")},
            "sink": w8_manifest.get("sink"),
            "without_sink": ({"top1": round(cpu[NO_SINK]["top1"], 4), "kl": round(cpu[NO_SINK]["kl"], 5)}
                             if NO_SINK in cpu else None),
            "ort_cpu": {p: {k: v for k, v in s.items()} for p, s in cpu.items()},
            "htp_emulation": htp,
            "nodes_on_htp_fraction": round(1 - off / nodes, 4) if nodes else None,
            "context_binary": binary if binary else f"false: {compiled['decode'].get('error')}",
            "context_binaries": {g: c.get("context_binaries") for g, c in compiled.items()},
            "qnn_compile": compiled,
            "compile_seconds": round(sum(c.get("compile_seconds", 0) for c in compiled.values()), 1),
            "model_bytes": {p: sum(manifest.read(b)["graphs"][g]["bytes"] for g in ("prefill", "decode"))
                            for p, b in builds.items()},
            "context_binary_bytes": sum(c.get("context_bytes", 0) for c in compiled.values()),
            "export_seconds": times,
            "export_manifest": {k: v for k, v in w8_manifest.items() if k != "files"},
            "prompts": {"set": "bench.prompts fidelity_prompts (chat)", "count": len(token_lists),
                        "tokens": [len(t) for t in token_lists],
                        "split": "first half of each prompt through the prefill graph, the rest decode",
                        "scored": "every position after the first (the sink's, which a sink export never runs)"},
            "provenance": provenance.collect(model=src),
        }
        if keep:
            dest = atomic.check_destination(keep, kind="npu-export")
            with atomic.directory(dest, kind="npu-export") as tmp:
                for p in w8.iterdir():
                    (shutil.copytree if p.is_dir() else shutil.copyfile)(p, tmp / p.name)
        atomic.write_result(out or default_out(), result)
        return result
    except EdgeError:
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
