"""One KV cache group on a model that mixes sliding-window and full-attention layers, on the
real engine: the Gemma 3 270M file's bf16 import (15 of 18 layers with a 512-token window), in
float32 so that both engines compute the same thing to rounding.

Past the window, vLLM with one group (what the edge engines ask for, runtime/kv_groups.py) and
with its hybrid manager gives transformers' float32 log-probabilities at every position and its
greedy tokens. Transformers without the window gives other log-probabilities on the same
sequence, so the comparison would see a window that is not applied."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import kv_groups
from vllm_edge.runtime.engine import edge_engine

from support.llamacpp import gemma3_gguf

pytestmark = pytest.mark.slow

LENGTH = 1100  # tokens scored: twice past the 512-token window
PROMPT = 700  # the greedy answers start here, past the window
NEW = 16
WINDOW = 512


@pytest.fixture(scope="module")
def sequence():
    from transformers import AutoTokenizer

    from vllm_edge.bench.prompts import long_document
    from vllm_edge.models import store

    imported = store.ensure_gguf(str(gemma3_gguf()), None)  # the bf16 import
    ids = AutoTokenizer.from_pretrained(str(imported))(long_document(["if", "for", "while"], 1200)).input_ids
    assert len(ids) >= LENGTH, len(ids)
    return imported, ids[:LENGTH]


def _vllm(llm, ids):
    from vllm import SamplingParams

    groups = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    scored = llm.generate([{"prompt_token_ids": ids}],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)[0].prompt_logprobs
    answer = llm.generate([{"prompt_token_ids": ids[:PROMPT]}],
                          SamplingParams(temperature=0.0, max_tokens=NEW), use_tqdm=False)[0]
    lps = [scored[i][ids[i]].logprob for i in range(1, len(ids))]
    return len(groups), lps, list(answer.outputs[0].token_ids)


def _transformers(path, ids, **overrides):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                 attn_implementation="eager", **overrides)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        answer = model.generate(torch.tensor([ids[:PROMPT]]), max_new_tokens=NEW, do_sample=False)
    return [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))], answer[0, PROMPT:].tolist()


@pytest.fixture(scope="module")
def arms(sequence, run_llm):
    path, ids = sequence
    out = {}
    for switch in ("1", "0"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(kv_groups.ENV_SWITCH, switch)
            edge = edge_engine(path, max_model_len=2048, enforce_eager=True, dtype="float32",
                               enable_prefix_caching=False, max_num_batched_tokens=512)
            out[switch] = (edge.kwargs, *run_llm(lambda llm: _vllm(llm, ids), **edge.kwargs))
    return out


def _worst_past_window(a, b):
    return max(abs(x - y) for x, y in zip(a[WINDOW:], b[WINDOW:]))


def test_one_group_and_the_hybrid_manager_give_transformers_logprobs_past_the_window(sequence, arms):
    path, ids = sequence
    ref, ref_answer = _transformers(path, ids)
    one_kwargs, one_groups, one_lps, one_answer = arms["1"]
    hyb_kwargs, hyb_groups, hyb_lps, hyb_answer = arms["0"]
    assert one_kwargs.get(kv_groups.VLLM_ARG) is True and kv_groups.VLLM_ARG not in hyb_kwargs
    assert one_groups == 1 and hyb_groups > 1, (one_groups, hyb_groups)
    # the check resolves the window: without it, the same sequence scores otherwise
    unwindowed, _ = _transformers(path, ids, sliding_window=4 * LENGTH)
    worst = {name: _worst_past_window(lps, ref)
             for name, lps in (("one group", one_lps), ("hybrid", hyb_lps), ("no window", unwindowed))}
    print(f"worst |log-prob - transformers'| past the window: {worst}")
    assert worst["one group"] < 2e-3 and worst["hybrid"] < 2e-3
    assert worst["no window"] > 5e-2
    assert one_answer == ref_answer and hyb_answer == ref_answer
