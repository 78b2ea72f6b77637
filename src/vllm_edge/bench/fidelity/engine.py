"""Plumbing between a vLLM ``LLM`` and :mod:`fidelity_metrics`: collect greedy
outputs and prompt log-probs, save a reference, score a candidate against it.

The engine is passed in (duck-typed ``llm.generate``), so this module never
starts one itself. The engine must allow ``max_logprobs >= k`` (vLLM's
default is 20). Both builds are fed the same token ids, which the reference
stores, so tokenizer or chat-template drift cannot pass for quantization error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from vllm_edge.bench import prompts as P
from vllm_edge.bench.fidelity import defaults
from vllm_edge.bench.fidelity import metrics as fm
from vllm_edge.common import atomic, manifest

REF_FORMAT = 1
REF_KIND = "fidelity-ref"  # its manifest's converter name: a re-save may replace it
# torch-free in defaults.py (`vllm-edge fidelity --help` reads them); kept here for callers
DEFAULT_K, DEFAULT_KL_K = defaults.DEFAULT_K, defaults.DEFAULT_KL_K
DEFAULT_CHUNK, DEFAULT_GREEDY_TOKENS = defaults.DEFAULT_CHUNK, defaults.DEFAULT_GREEDY_TOKENS


def _vllm_params(**kw: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(**kw)


def _lp(v: Any) -> float:
    return float(v.logprob if hasattr(v, "logprob") else v)


def completion_text(tokenizer: Any, item: dict) -> str | None:
    """A fidelity prompt as a base model (no chat template) reads it, its messages' text; None
    for a tokenizer with a template, which renders the messages."""
    if hasattr(tokenizer, "chat_template") and not tokenizer.chat_template:
        return "\n".join(m["content"] for m in item["messages"])
    return None


def chat_prompt_ids(tokenizer: Any, items: Sequence[dict] | None = None) -> list[list[int]]:
    """The prompts as token ids: through the chat template, or, for a base model without one,
    as a plain completion of the messages' text (with the BOS its tokenizer adds)."""
    items = P.fidelity_prompts() if items is None else items
    out = []
    for p in items:
        plain = completion_text(tokenizer, p)
        if plain is not None:
            out.append(list(tokenizer(plain).input_ids))
            continue
        ids = tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        out.append(list(ids))
    return out


def greedy(llm: Any, prompt_ids: list[list[int]], max_tokens: int = DEFAULT_GREEDY_TOKENS,
           make_params: Callable[..., Any] = _vllm_params) -> list[list[int]]:
    sp = make_params(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def positions_from_prompt_logprobs(prompt_logprobs: Any, token_ids: Sequence[int],
                                   scored: range) -> tuple[list[dict[int, float]], list[float]]:
    """vLLM's ``prompt_logprobs[i]`` is the distribution that predicted token i
    (entry 0 is None); position t predicts token t+1. Works for lists and FlatLogprobs."""
    positions, target = [], []
    for t in scored:
        entry = prompt_logprobs[t + 1]
        d = {int(tok): _lp(v) for tok, v in entry.items()}
        nxt = int(token_ids[t + 1])
        if nxt not in d:
            raise ValueError(f"prompt_logprobs at {t + 1} lack the prompt token {nxt}")
        positions.append(d)
        target.append(d[nxt])
    return positions, target


def teacher_forced_logprobs(llm: Any, chunks: list[list[int]], k: int,
                            make_params: Callable[..., Any] = _vllm_params
                            ) -> tuple[list[dict[int, float]], list[float]]:
    # prefix caching must be off in the engine: a cached prefix returns no prompt logprobs.
    sp = make_params(temperature=0.0, max_tokens=1, prompt_logprobs=k)
    outs = llm.generate([{"prompt_token_ids": c} for c in chunks], sp, use_tqdm=False)
    positions: list[dict[int, float]] = []
    target: list[float] = []
    for chunk, o in zip(chunks, outs):
        pos, tgt = positions_from_prompt_logprobs(o.prompt_logprobs, chunk, P.scored_range(len(chunk)))
        positions += pos
        target += tgt
    return positions, target


def collect(llm: Any, tokenizer: Any, k: int = DEFAULT_K, chunk_len: int = DEFAULT_CHUNK,
            max_chunks: int | None = 16, greedy_tokens: int = DEFAULT_GREEDY_TOKENS,
            prompt_ids: list[list[int]] | None = None, chunks: list[list[int]] | None = None,
            make_params: Callable[..., Any] = _vllm_params) -> dict:
    """Everything one build contributes. Pass the reference's ``prompt_ids`` and
    ``chunks`` when collecting a candidate."""
    if prompt_ids is None:
        prompt_ids = chat_prompt_ids(tokenizer)
    if chunks is None:
        chunks = P.corpus_chunks(lambda s: tokenizer.encode(s, add_special_tokens=False),
                                 chunk_len, max_chunks)
    outs = greedy(llm, prompt_ids, greedy_tokens, make_params)
    positions, target = teacher_forced_logprobs(llm, chunks, k, make_params)
    return {"prompt_ids": prompt_ids, "greedy": outs, "chunks": chunks, "k": k,
            "positions": positions, "target_lp": target}


def save_reference(path: str | os.PathLike, data: dict, meta: dict | None = None) -> Path:
    """A directory: ``meta.json`` (ids, outputs, corpus identity) and ``teacher.pt`` (dense top-k)."""
    k = data["k"]
    pos = data["positions"]
    ids = torch.empty(len(pos), k, dtype=torch.long)
    lp = torch.empty(len(pos), k, dtype=torch.float64)
    for t, d in enumerate(pos):
        top = sorted(d.items(), key=lambda kv: kv[1], reverse=True)[:k]
        if len(top) < k:
            raise ValueError(f"position {t}: {len(top)} log-probs, need k={k}")
        ids[t] = torch.tensor([i for i, _ in top])
        lp[t] = torch.tensor([v for _, v in top], dtype=torch.float64)
    body = {"format": REF_FORMAT, "k": k, "corpus": P.corpus_id(),
            # the prompts' names: a selection's (``--prompts``), else the first of the 12
            "prompts": (data.get("prompts")
                        or [p["id"] for p in P.fidelity_prompts()][:len(data["prompt_ids"])]),
            "prompt_ids": data["prompt_ids"], "greedy": data["greedy"], "chunks": data["chunks"],
            "meta": meta or {}}
    with atomic.directory(path, kind=REF_KIND) as tmp:
        (tmp / "meta.json").write_text(json.dumps(body) + "\n")
        manifest.write(tmp, {"converter": f"{REF_KIND}/{REF_FORMAT}", "k": k})
        torch.save({"ids": ids, "lp": lp,
                    "target_lp": torch.tensor(data["target_lp"], dtype=torch.float64)}, tmp / "teacher.pt")
    return Path(path)


def load_reference(path: str | os.PathLike) -> dict:
    p = Path(path)
    body = json.loads((p / "meta.json").read_text())
    if body.get("format") != REF_FORMAT:
        raise ValueError(f"{p}: reference format {body.get('format')}, expected {REF_FORMAT}")
    here = P.corpus_id()["sha256"]
    if body["corpus"]["sha256"] != here:
        raise ValueError(f"{p}: corpus differs from this Python's pydoc_data.topics "
                         f"(reference Python {body['corpus']['python']}); save a new reference")
    body.update(torch.load(p / "teacher.pt", weights_only=True))
    return body


def score(ref: dict, cand: dict, kl_k: int = DEFAULT_KL_K) -> dict:
    """Greedy divergence and teacher-forced metrics of ``cand`` against ``ref``."""
    if cand["prompt_ids"] != ref["prompt_ids"] or cand["chunks"] != ref["chunks"]:
        raise ValueError("candidate was not fed the reference's token ids")
    kl_k = min(kl_k, ref["k"])
    ids, rlp = ref["ids"][:, :kl_k], ref["lp"][:, :kl_k]
    T = ids.shape[0]
    if len(cand["positions"]) != T:
        raise ValueError(f"reference has {T} scored positions, candidate {len(cand['positions'])}")
    clp = torch.full((T, kl_k), float("nan"), dtype=torch.float64)
    ctop = torch.empty(T, dtype=torch.long)
    for t, d in enumerate(cand["positions"]):
        for j, tok in enumerate(ids[t].tolist()):
            if tok in d:
                clp[t, j] = d[tok]
        ctop[t] = max(d.items(), key=lambda kv: kv[1])[0]
    tf = fm.teacher_forced(ids, rlp, clp, ctop, ref["target_lp"],
                           torch.tensor(cand["target_lp"], dtype=torch.float64))
    g = fm.greedy_divergence(ref["greedy"], cand["greedy"])
    for item, name in zip(g["per_prompt"], ref.get("prompts") or []):
        item["id"] = name
    return {"greedy": g, "teacher_forced": tf, "corpus": ref.get("corpus"), "kl_k": kl_k}
