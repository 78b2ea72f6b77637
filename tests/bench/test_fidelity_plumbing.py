"""Reference save/score against a fake engine that mimics vLLM's output shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_edge.bench.fidelity import engine as fidelity

V = 40


class FakeTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [ord(c) % V for m in messages for c in m["content"][:200]]

    def encode(self, s, add_special_tokens=False):
        return [ord(c) % V for c in s]


class FakeLLM:
    """A bigram model: next-token logits depend on the last token only."""

    def __init__(self, noise: float = 0.0):
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(V, V, generator=g) * 4
        if noise:
            self.table = self.table + noise * torch.randn(V, V, generator=torch.Generator().manual_seed(7))
        self.lp = torch.log_softmax(self.table.double(), -1)

    def generate(self, prompts, sp, use_tqdm=False):
        outs = []
        for p in prompts:
            ids = p["prompt_token_ids"]
            gen, last = [], ids[-1]
            for _ in range(sp["max_tokens"]):
                last = int(self.lp[last].argmax())
                gen.append(last)
            plp = None
            if sp.get("prompt_logprobs"):
                plp = [None]
                for i in range(1, len(ids)):
                    row = self.lp[ids[i - 1]]
                    top = row.topk(sp["prompt_logprobs"]).indices.tolist()
                    plp.append({t: SimpleNamespace(logprob=float(row[t])) for t in set(top) | {ids[i]}})
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=gen)], prompt_logprobs=plp))
        return outs


def _collect(llm, ref=None):
    kw = dict(k=8, chunk_len=64, max_chunks=3, greedy_tokens=12, make_params=lambda **kw: kw)
    if ref is not None:
        kw.update(prompt_ids=ref["prompt_ids"], chunks=ref["chunks"])
    return fidelity.collect(llm, FakeTokenizer(), **kw)


def test_self_is_perfect_and_perturbed_is_worse(tmp_path):
    ref_dir = fidelity.save_reference(tmp_path / "ref", _collect(FakeLLM()), meta={"model": "fake"})
    ref = fidelity.load_reference(ref_dir)
    assert ref["ids"].shape == (3 * 31, 8)  # 3 chunks, scored positions 32..62

    same = fidelity.score(ref, _collect(FakeLLM(), ref), kl_k=4)
    assert same["greedy"]["exact_matches"] == 12 and same["greedy"]["kept_fraction"] == 1.0
    assert same["teacher_forced"]["kl_mean"] == 0.0
    assert same["teacher_forced"]["top1_agreement"] == 1.0
    assert same["teacher_forced"]["delta_logprob"] == 0.0 and same["teacher_forced"]["coverage"] == 1.0
    assert same["greedy"]["per_prompt"][0]["id"] == "chat-capital"

    worse = fidelity.score(ref, _collect(FakeLLM(noise=3.0), ref), kl_k=4)
    assert worse["teacher_forced"]["kl_mean"] > 0.05
    assert worse["teacher_forced"]["top1_agreement"] < 1.0
    assert worse["greedy"]["exact_matches"] < 12


def test_candidate_must_use_reference_ids(tmp_path):
    ref = fidelity.load_reference(fidelity.save_reference(tmp_path / "ref", _collect(FakeLLM())))
    cand = _collect(FakeLLM(), ref)
    cand["chunks"] = cand["chunks"][:1]
    with pytest.raises(ValueError, match="token ids"):
        fidelity.score(ref, cand)


def test_reference_from_another_corpus_is_refused(tmp_path):
    import json

    d = fidelity.save_reference(tmp_path / "ref", _collect(FakeLLM()))
    meta = json.loads((d / "meta.json").read_text())
    meta["corpus"]["sha256"] = "0" * 64
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="corpus differs"):
        fidelity.load_reference(d)
