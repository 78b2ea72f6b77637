"""`vllm-edge fidelity`: save a bf16 reference, or score a build against one.

Owns the engine for :mod:`fidelity` (which never starts one). Prefix caching
is off, since a cached prefix returns no prompt log-probs, and
``max_logprobs`` covers the reference's top-k.
"""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any

from vllm_edge.bench.fidelity import engine as fidelity
from vllm_edge.bench.fidelity.defaults import DEFAULT_CORPUS_CHUNKS
from vllm_edge.quant.groups import DEFAULT_GROUP

LEN_ROUND = 256

# Metrics on the last stdout line, for grid arms.
LINE_KEYS = {"greedy": ("exact_matches", "kept_fraction", "first_token_agreement"),
             "teacher_forced": ("top1_agreement", "kl_mean", "kl_median", "kl_p99",
                                "delta_logprob", "coverage")}


def needed_len(prompt_ids: list[list[int]], chunks: list[list[int]], greedy_tokens: int) -> int:
    n = max([len(p) + greedy_tokens for p in prompt_ids] + [len(c) + 1 for c in chunks])
    return -(-n // LEN_ROUND) * LEN_ROUND


def metric_line(result: dict) -> dict:
    line: dict[str, Any] = {"benchmark": "fidelity", "build": result["build"]}
    for part, keys in LINE_KEYS.items():
        for k in keys:
            v = result[part].get(k)
            if v is not None:
                line[k] = v
    return line


def format_metrics(result: dict) -> str:
    g, tf = result["greedy"], result["teacher_forced"]
    return "\n".join([
        f"greedy divergence over {g['prompts']} prompts: exact {g['exact_matches_str']}, "
        f"kept before divergence {g['kept_fraction']:.3f}, first-token top-1 {g['first_token_agreement']:.3f}",
        f"teacher-forced over {tf['positions']} positions (KL over top-{result['kl_k']} + tail): "
        f"top-1 agreement {tf['top1_agreement']:.4f}, KL mean {tf['kl_mean']:.5f} "
        f"median {tf['kl_median']:.5f} p99 {tf['kl_p99']:.5f}, "
        f"delta logprob {tf.get('delta_logprob', float('nan')):+.5f}, coverage {tf['coverage']:.3f}",
    ])


def _engine(path: Path, max_model_len: int, k: int, dtype: str, enforce_eager: bool) -> Any:
    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(path, max_model_len=max_model_len, max_num_seqs=4, dtype=dtype,
                       enforce_eager=enforce_eager, enable_prefix_caching=False)
    edge.kwargs.update(max_logprobs=max(20, k), disable_log_stats=True)
    edge.apply_env()
    from vllm import LLM

    return LLM(**edge.kwargs), edge


def run(model: str, save_ref: str | None = None, ref: str | None = None, out: str | None = None,
        corpus_chunks: int = DEFAULT_CORPUS_CHUNKS, chunk_len: int = fidelity.DEFAULT_CHUNK,
        greedy_tokens: int = fidelity.DEFAULT_GREEDY_TOKENS, kl_k: int = fidelity.DEFAULT_KL_K,
        dtype: str = "bfloat16", enforce_eager: bool = False, quant: str | None = None,
        group: int = DEFAULT_GROUP, prompts: tuple[str, ...] | None = None) -> dict:
    """``prompts``: the fidelity prompts a saved reference holds, by id (None: all 12)."""
    from vllm_edge.bench import prompts as P
    from vllm_edge.common import atomic, provenance
    from vllm_edge.models.resolver import ensure_model, own_scheme

    if (save_ref is None) == (ref is None):
        raise ValueError("give exactly one of --save-ref DIR or --ref DIR")
    if prompts is not None and ref is not None:
        raise ValueError("--prompts picks what --save-ref saves; with --ref the reference decides")
    quant = quant or own_scheme(model)
    path = Path(ensure_model(model, quant, group if quant else None))
    build = f"{path.name} ({dtype}, {'eager' if enforce_eager else 'compiled'})"
    if ref is not None:
        reference = fidelity.load_reference(ref)
        prompt_ids, chunks, k = reference["prompt_ids"], reference["chunks"], reference["k"]
        greedy_tokens = reference["meta"].get("greedy_tokens", greedy_tokens)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path))
        items = P.select_fidelity_prompts(prompts)
        names = [p["id"] for p in items]
        prompt_ids = fidelity.chat_prompt_ids(tok, items)
        chunks = P.corpus_chunks(lambda s: tok.encode(s, add_special_tokens=False), chunk_len, corpus_chunks)
        k = fidelity.DEFAULT_K
    llm, edge = _engine(path, needed_len(prompt_ids, chunks, greedy_tokens), k, dtype, enforce_eager)
    data = fidelity.collect(llm, None, k=k, greedy_tokens=greedy_tokens,
                            prompt_ids=prompt_ids, chunks=chunks)
    del llm
    prov = provenance.collect(model=path)
    repack = _repack_summary(path)
    if save_ref is not None:
        fidelity.save_reference(save_ref, {**data, "prompts": names},
                                meta={"model": str(path), "build": build, "greedy_tokens": greedy_tokens,
                                      "provenance": prov})
        result = {"benchmark": "fidelity-reference", "build": build, "model": str(path),
                  "reference": str(save_ref), "prompts": len(prompt_ids), "chunks": len(chunks),
                  "k": k, "engine": edge.describe(), "provenance": prov}
    else:
        scored = fidelity.score(reference, data, kl_k=kl_k)
        result = {"benchmark": "fidelity", "build": build, "model": str(path), "reference": str(ref),
                  "reference_build": reference["meta"].get("build"),
                  "reference_model": reference["meta"].get("model"), **scored,
                  "chunks": len(chunks), "engine": edge.describe(), "provenance": prov}
    if repack:
        result["repack"] = repack
    return atomic.write_result(out, result)


def _repack_summary(path: Path) -> dict | None:
    """What a GGUF repack build kept of its file (types, routes, bytes against the file's), so
    a same-file comparison says what ran; None for any other build."""
    from vllm_edge.models.gguf_repack import REPORT_NAME

    try:
        report = json.loads((path / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return None
    return {"source": Path(str(report.get("source", ""))).name, "gguf_types": report.get("gguf_types"),
            "routes": report.get("routes"), "bits_per_weight": report.get("bits_per_weight"),
            "bytes_vs_gguf": report.get("bytes_vs_gguf"),
            "runtime_bytes_vs_gguf": report.get("runtime_bytes_vs_gguf"),
            "max_error_over_bound": report.get("max_error_over_bound")}
