"""Fidelity math on synthetic logits: a build against itself is perfect, a perturbed one is not."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_edge.bench.fidelity import metrics as fm


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(300, 500, generator=g) * 3.0, torch.randint(0, 500, (300,), generator=g)


def test_greedy_self_is_perfect():
    seqs = [[1, 2, 3, 4], [5, 6], [7]]
    r = fm.greedy_divergence(seqs, seqs)
    assert r["exact_matches"] == 3 and r["exact_matches_str"] == "3/3"
    assert r["kept_fraction"] == 1.0 and r["first_token_agreement"] == 1.0
    assert all(p["first_divergence"] is None for p in r["per_prompt"])


def test_greedy_divergence_counts():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9], [1, 1, 1, 1]]
    cand = [[1, 2, 3, 4], [5, 6, 0, 0], [0, 9], [1, 1, 1, 1, 1]]  # last: longer => not exact
    r = fm.greedy_divergence(ref, cand)
    assert r["exact_matches"] == 1
    assert r["kept_fraction"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert r["first_token_agreement"] == pytest.approx(3 / 4)
    assert [p["first_divergence"] for p in r["per_prompt"]] == [None, 2, 0, 4]
    with pytest.raises(ValueError):
        fm.greedy_divergence(ref, cand[:2])


def test_teacher_forced_self_is_perfect(logits):
    x, targets = logits
    r = fm.teacher_forced_from_logits(x, x.clone(), targets, k=10)
    assert r["top1_agreement"] == 1.0
    assert r["kl_mean"] == 0.0 and r["kl_p99"] == 0.0 and r["kl_full_mean"] == pytest.approx(0.0, abs=1e-12)
    assert r["delta_logprob"] == 0.0 and r["delta_p_rms"] == 0.0
    assert r["coverage"] == 1.0 and r["positions"] == 300


def test_perturbed_build_scores_worse_and_more_so_when_perturbed_more(logits):
    x, targets = logits
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(x.shape, generator=g)
    small = fm.teacher_forced_from_logits(x, x + 0.3 * noise, targets, k=10)
    big = fm.teacher_forced_from_logits(x, x + 3.0 * noise, targets, k=10)
    assert 0 < small["kl_mean"] < big["kl_mean"]
    assert 1.0 > small["top1_agreement"] > big["top1_agreement"]
    assert small["kl_median"] <= small["kl_p99"] <= small["kl_max"]
    # Merging the tail can only lose information: top-k+tail KL is a lower bound on the full KL.
    for r in (small, big):
        assert r["kl_mean"] <= r["kl_full_mean"] + 1e-9
    # Adding noise to logits makes the corpus token less likely on average.
    assert big["delta_logprob"] < 0 and big["ln_ppl_ratio"] == pytest.approx(-big["delta_logprob"])


def test_topk_tail_kl_matches_hand_computation():
    # V = 4; reference top-2 = ids 0, 1.
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    q = torch.tensor([[0.4, 0.4, 0.1, 0.1]], dtype=torch.float64)
    r = fm.teacher_forced_from_logits(p.log(), q.log(), k=2)
    want = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / 0.2)
    assert r["kl_mean"] == pytest.approx(want, abs=1e-12)
    full = sum(a * math.log(a / b) for a, b in zip(p[0].tolist(), q[0].tolist()))
    assert r["kl_full_mean"] == pytest.approx(full, abs=1e-9)
    assert r["topk_mass"] == pytest.approx(0.8)
    # Reference top-1 is id 0; the candidate ties 0 and 1 and argmax picks 0.
    assert r["delta_logprob_ref_top1"] == pytest.approx(math.log(0.4) - math.log(0.5))


def test_sparse_logprobs_fold_missing_ids_into_the_tail():
    # Engines report only their own top-k: candidate did not report id 1.
    ref = [{0: math.log(0.5), 1: math.log(0.3), 2: math.log(0.15)}]
    cand = [{0: math.log(0.4), 3: math.log(0.35)}]
    ids, rlp, clp, ctop = fm.positions_to_tensors(ref, cand, k=2)
    assert ids.tolist() == [[0, 1]] and math.isnan(clp[0, 1]) and ctop.tolist() == [0]
    r = fm.teacher_forced(ids, rlp, clp, ctop)
    # Partition {0}, {rest}: p = (0.5, 0.5), q = (0.4, 0.6).
    want = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)
    assert r["kl_mean"] == pytest.approx(want, abs=1e-12)
    assert r["coverage"] == pytest.approx(0.5 / 0.8)
    with pytest.raises(ValueError, match="need k=3"):
        fm.positions_to_tensors([{0: 0.0}], cand, k=3)


def test_sparse_self_comparison_is_perfect():
    ref = [{5: math.log(0.6), 6: math.log(0.3), 7: math.log(0.05)}, {1: math.log(0.9), 2: math.log(0.05)}]
    r = fm.teacher_forced(*fm.positions_to_tensors(ref, ref, k=2),
                          ref_target_lp=torch.tensor([math.log(0.3), math.log(0.9)]),
                          cand_target_lp=torch.tensor([math.log(0.3), math.log(0.9)]))
    assert r["kl_mean"] == 0.0 and r["top1_agreement"] == 1.0 and r["coverage"] == 1.0
    assert r["delta_logprob"] == 0.0


def test_candidate_minus_infinity_stays_finite():
    p = torch.tensor([[0.7, 0.2, 0.1]]).log()
    q = torch.tensor([[0.0, 0.5, 0.5]]).log()  # candidate rules out the reference's top-1
    r = fm.teacher_forced_from_logits(p, q, k=2)
    assert math.isfinite(r["kl_mean"]) and r["kl_mean"] > 10 and r["top1_agreement"] == 0.0
