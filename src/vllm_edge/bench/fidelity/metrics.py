"""Fidelity of a candidate build against its own reference build (docs/design/fidelity.md).

Pure functions over token ids and log-probabilities; no engine here.

Greedy divergence (:func:`greedy_divergence`), per prompt, on token ids:

* ``exact_matches``: candidate output identical to the reference output (n of N);
* ``kept_fraction``: length of the common prefix / length of the reference,
  averaged over prompts (1.0 = never diverged);
* ``first_token_agreement``: fraction of prompts whose first generated token
  equals the reference's (greedy, so this is top-1 agreement at position 0).

Teacher-forced (:func:`teacher_forced`), both builds read the same token
sequence; at every scored position t, with p = reference and q = candidate
next-token distributions:

* ``top1_agreement``: argmax p == argmax q. This is llama-perplexity's
  "Same top p".
* ``kl``: KL(p || q) over a partition of the vocabulary into the reference's
  top-k tokens plus one tail bucket holding everything else:
  ``sum_i p_i log(p_i / q_i) + p_tail log(p_tail / q_tail)`` with
  ``p_tail = 1 - sum_i p_i`` and ``q_tail = 1 - sum_i q_i`` over the same ids.
  Merging tokens can only lose information, so this is a lower bound on the
  full-vocabulary KL that llama-perplexity's "Mean KLD" reports, and it
  converges to it as k grows (the top-k usually holds >99% of p). Reported as
  mean (with standard error), median and p99 over positions. When full logits
  are available :func:`teacher_forced_from_logits` also reports the exact
  full-vocabulary KL as ``kl_full``.
* ``delta_logprob``: mean of ``log q(x) - log p(x)`` for the corpus token x
  (the token that actually comes next). Negative means the candidate is more
  surprised. Its negation is llama-perplexity's "Mean ln(PPL(Q)/PPL(base))".
  ``delta_p`` is the same in probability space (mean and RMS, as llama's "Δp").
  ``delta_logprob_ref_top1`` is the same for the reference's top-1 token.
* ``coverage``: share of the reference's top-k probability mass whose ids the
  candidate reported a log-prob for. Engines that only return their own top-k
  (vLLM's ``prompt_logprobs``) can miss some of the reference's ids; those
  are folded into the tail on both sides, which keeps the KL an exact KL of a
  coarser partition. Coverage < 1 says how much coarser. ``topk_mass`` is the
  mean reference mass inside the top-k.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

TAIL_FLOOR = 1e-12  # q_tail can round to 0 while p_tail > 0; bound the term instead of inf
LOGPROB_FLOOR = -100.0  # same for a candidate log-prob of -inf (masked or underflowed)


# --- greedy -----------------------------------------------------------------

def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def greedy_divergence(refs: Sequence[Sequence[int]], cands: Sequence[Sequence[int]]) -> dict:
    if len(refs) != len(cands):
        raise ValueError(f"{len(refs)} reference outputs but {len(cands)} candidate outputs")
    if not refs:
        raise ValueError("no prompts")
    per_prompt = []
    for ref, cand in zip(refs, cands):
        ref, cand = list(ref), list(cand)
        k = common_prefix(ref, cand)
        per_prompt.append({
            "ref_len": len(ref), "cand_len": len(cand), "first_divergence": None if ref == cand else k,
            "exact": ref == cand,
            "kept_fraction": (k / len(ref)) if ref else float(not cand),
            "first_token_agrees": bool(ref and cand and ref[0] == cand[0]) or (not ref and not cand),
        })
    n = len(per_prompt)
    exact = sum(p["exact"] for p in per_prompt)
    return {
        "prompts": n,
        "exact_matches": exact,
        "exact_matches_str": f"{exact}/{n}",
        "kept_fraction": sum(p["kept_fraction"] for p in per_prompt) / n,
        "first_token_agreement": sum(p["first_token_agrees"] for p in per_prompt) / n,
        "per_prompt": per_prompt,
    }


# --- teacher-forced ----------------------------------------------------------

def _quantile(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x, q)) if x.numel() else float("nan")


def _sem(x: torch.Tensor) -> float:
    return float(x.std(unbiased=True) / math.sqrt(x.numel())) if x.numel() > 1 else float("nan")


def teacher_forced(ref_topk_ids: torch.Tensor, ref_topk_lp: torch.Tensor,
                   cand_lp_at_ref: torch.Tensor, cand_top1: torch.Tensor,
                   ref_target_lp: torch.Tensor | None = None,
                   cand_target_lp: torch.Tensor | None = None) -> dict:
    """Core over T scored positions.

    ref_topk_ids [T, k]: reference top-k ids, most likely first.
    ref_topk_lp  [T, k]: their reference log-probs.
    cand_lp_at_ref [T, k]: candidate log-probs of the same ids; NaN where the
        candidate did not report that id (folded into the tail).
    cand_top1 [T]: candidate argmax id.
    ref_target_lp / cand_target_lp [T]: log-probs of the corpus token, if known.
    """
    if ref_topk_lp.shape != cand_lp_at_ref.shape or ref_topk_lp.shape != ref_topk_ids.shape:
        raise ValueError("reference ids, reference log-probs and candidate log-probs must share [T, k]")
    T = ref_topk_lp.shape[0]
    if T == 0:
        raise ValueError("no scored positions")
    p_lp = ref_topk_lp.double()
    q_lp = cand_lp_at_ref.double()
    known = ~torch.isnan(q_lp)
    p = p_lp.exp()
    p_k = torch.where(known, p, torch.zeros_like(p))
    q_k = torch.where(known, q_lp.exp(), torch.zeros_like(p))
    terms = torch.where(known & (p > 0), p * (p_lp - torch.nan_to_num(q_lp, nan=0.0).clamp(min=LOGPROB_FLOOR)), torch.zeros_like(p))
    p_tail = (1.0 - p_k.sum(-1)).clamp(min=0.0)
    q_tail = (1.0 - q_k.sum(-1)).clamp(min=TAIL_FLOOR)
    tail = torch.where(p_tail > 0, p_tail * (p_tail.clamp(min=TAIL_FLOOR).log() - q_tail.log()),
                       torch.zeros_like(p_tail))
    kl = (terms.sum(-1) + tail).clamp(min=0.0)  # negative only by rounding

    top1 = (ref_topk_ids[:, 0] == cand_top1).double()
    mass = p.sum(-1)
    coverage = p_k.sum(-1) / mass.clamp(min=TAIL_FLOOR)
    q_top1 = q_lp[:, 0]
    have_top1 = ~torch.isnan(q_top1)

    out = {
        "positions": T,
        "k": ref_topk_lp.shape[1],
        "top1_agreement": float(top1.mean()),
        "top1_agreement_sem": _sem(top1),
        "kl_mean": float(kl.mean()),
        "kl_mean_sem": _sem(kl),
        "kl_median": _quantile(kl, 0.5),
        "kl_p99": _quantile(kl, 0.99),
        "kl_max": float(kl.max()),
        "coverage": float(coverage.mean()),
        "topk_mass": float(mass.mean()),
        "delta_logprob_ref_top1": (float((q_top1[have_top1] - p_lp[have_top1, 0]).mean())
                                   if have_top1.any() else None),
    }
    if ref_target_lp is not None and cand_target_lp is not None:
        d = cand_target_lp.double() - ref_target_lp.double()
        dp = cand_target_lp.double().exp() - ref_target_lp.double().exp()
        out.update({
            "delta_logprob": float(d.mean()),
            "delta_logprob_sem": _sem(d),
            "ln_ppl_ratio": float(-d.mean()),
            "delta_p_mean": float(dp.mean()),
            "delta_p_rms": float(dp.pow(2).mean().sqrt()),
        })
    return out


def teacher_forced_from_logits(ref_logits: torch.Tensor, cand_logits: torch.Tensor,
                               targets: torch.Tensor | None = None, k: int = 20,
                               chunk: int = 256) -> dict:
    """Both builds' logits [T, V] at the same positions; ``targets`` [T] are the corpus tokens
    that follow each position. Adds the exact full-vocabulary KL (``kl_full_*``)."""
    if ref_logits.shape != cand_logits.shape or ref_logits.dim() != 2:
        raise ValueError(f"logits must both be [T, V]; got {tuple(ref_logits.shape)} and "
                         f"{tuple(cand_logits.shape)}")
    ids, rlp, clp, ctop, rt, ct, full = [], [], [], [], [], [], []
    for s in range(0, ref_logits.shape[0], chunk):  # bounds the float64 [chunk, V] copies
        r = torch.log_softmax(ref_logits[s:s + chunk].double(), -1)
        c = torch.log_softmax(cand_logits[s:s + chunk].double(), -1)
        top_lp, top_ids = r.topk(min(k, r.shape[-1]), dim=-1)
        ids.append(top_ids)
        rlp.append(top_lp)
        clp.append(c.gather(-1, top_ids))
        ctop.append(c.argmax(-1))
        full.append((r.exp() * (r - c)).sum(-1).clamp(min=0.0))
        if targets is not None:
            t = targets[s:s + chunk].long().unsqueeze(-1)
            rt.append(r.gather(-1, t).squeeze(-1))
            ct.append(c.gather(-1, t).squeeze(-1))
    out = teacher_forced(torch.cat(ids), torch.cat(rlp), torch.cat(clp), torch.cat(ctop),
                         torch.cat(rt) if rt else None, torch.cat(ct) if ct else None)
    kl_full = torch.cat(full)
    out.update({"kl_full_mean": float(kl_full.mean()), "kl_full_median": _quantile(kl_full, 0.5),
                "kl_full_p99": _quantile(kl_full, 0.99)})
    return out


def positions_to_tensors(ref: Sequence[dict[int, float]], cand: Sequence[dict[int, float]],
                         k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse per-position log-probs ({token_id: logprob}, as engines return them)
    to the dense inputs of :func:`teacher_forced`. The reference needs at least
    ``k`` entries per position; the candidate may report any subset."""
    if len(ref) != len(cand):
        raise ValueError(f"{len(ref)} reference positions but {len(cand)} candidate positions")
    T = len(ref)
    ids = torch.empty(T, k, dtype=torch.long)
    rlp = torch.empty(T, k, dtype=torch.float64)
    clp = torch.full((T, k), float("nan"), dtype=torch.float64)
    ctop = torch.empty(T, dtype=torch.long)
    for t, (r, c) in enumerate(zip(ref, cand)):
        if len(r) < k:
            raise ValueError(f"position {t}: reference has {len(r)} log-probs, need k={k}")
        if not c:
            raise ValueError(f"position {t}: candidate reported no log-probs")
        top = sorted(r.items(), key=lambda kv: kv[1], reverse=True)[:k]
        for j, (tok, lp) in enumerate(top):
            ids[t, j] = tok
            rlp[t, j] = lp
            if tok in c:
                clp[t, j] = c[tok]
        ctop[t] = max(c.items(), key=lambda kv: kv[1])[0]
    return ids, rlp, clp, ctop
