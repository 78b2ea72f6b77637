"""Import parity against llama.cpp, without llama.cpp: the judge picks the right criterion, and
what is refused or not run says why. The parity runs themselves are in test_gguf_verify_engine."""

from __future__ import annotations

import numpy as np
import pytest

from support.llamacpp import default_gguf
from vllm_edge.bench.engines import llamacpp as llamacpp_runner
from vllm_edge.bench.llamacpp import verify as gguf_verify
from vllm_edge.bench.llamacpp.verify import Inputs, VerifyConfig, compare


def _inputs(n_chunks=1, chunk_len=8):
    return Inputs(prompt_ids=["a", "b"], prompt_texts=["x", "y"], prompt_tokens=[[1, 2], [3]],
                  chunks=[list(range(chunk_len))] * n_chunks, eos=2)


def test_judge_uses_greedy_for_float_sources_and_teacher_forced_for_quantized():
    rng = np.random.default_rng(0)
    cfg = VerifyConfig(chunk_len=8)
    logits = [rng.normal(size=(3, 16)).astype(np.float32)]
    ref = {"greedy": [[5, 6], [7]], "tokenizer": [[1, 2], [3]], "logits": logits}
    same = {"greedy": [[5, 6], [7]], "logits": [l + 0.001 for l in logits]}
    off = {"greedy": [[5, 9], [7]], "logits": same["logits"]}
    assert compare(ref, same, _inputs(), cfg, quantized=False)["passed"]
    r = compare(ref, off, _inputs(), cfg, quantized=False)
    assert not r["passed"] and r["greedy"]["per_prompt"][0]["first_divergence"] == 1
    # Quantized source: greedy differences are reported but teacher-forced top-1 decides.
    r = compare(ref, off, _inputs(), cfg, quantized=True)
    assert r["passed"] and r["teacher_forced"]["top1_agreement"] == 1.0
    shuffled = {"greedy": ref["greedy"], "logits": [rng.normal(size=(3, 16)).astype(np.float32)]}
    assert not compare(ref, shuffled, _inputs(), cfg, quantized=True)["passed"]
    assert r["tokenizer_agreement"]["identical"] == 2


def test_quantized_verdict_needs_both_the_f32_copy_and_the_noise_floor():
    cfg = VerifyConfig()
    tf = lambda top1: {"teacher_forced": {"top1_agreement": top1}}  # noqa: E731
    deq_ok = {"passed": True, "criterion": "top-1 >= 0.99"}
    deq_bad = {"passed": False, "criterion": "top-1 >= 0.99"}
    # SmolLM2 Q4_1 as measured: 0.9725 on the file, llama.cpp's own floor 0.9725
    assert gguf_verify.judge_quantized(tf(0.9725), deq_ok, tf(0.9725), cfg)["passed"]
    r = gguf_verify.judge_quantized(tf(0.95), deq_ok, tf(0.9725), cfg)  # dequantization off llama.cpp's
    assert not r["passed"] and r["within_noise_floor"]["passed"] is False
    assert not gguf_verify.judge_quantized(tf(0.9725), deq_bad, tf(0.9725), cfg)["passed"]
    assert "noise" not in r["criterion"] and "quantized-vs-f32" in r["criterion"]


def test_source_is_recognised_as_quantized():
    src = default_gguf()
    assert llamacpp_runner.quantization_types(src) >= {"Q4_1"}
    assert llamacpp_runner.is_quantized(src)


def test_verify_flag_without_llama_cpp_says_so(monkeypatch, capsys, default_model_dir):
    from vllm_edge.cli.models import import_gguf as gguf_cli

    monkeypatch.setattr(llamacpp_runner, "available", lambda: False)
    rc = gguf_cli.run_verify(str(default_gguf()), default_model_dir, None)
    assert rc == 0
    assert "verify: NOT run" in capsys.readouterr().err
