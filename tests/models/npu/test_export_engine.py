"""export-npu on the real default model (slow: two quantized graphs of 135M parameters): the
graphs carry int8 weights and uint16 activations and stay close to the bf16 model teacher-forced."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime.quantization")


def test_default_model_exports_and_scores(tmp_path):
    from transformers import AutoTokenizer

    from vllm_edge.bench import npu
    from vllm_edge.common import manifest
    from vllm_edge.models.npu.export import export_npu, resolve_source

    out = export_npu("default", tmp_path / "smol", context=64, prefill=16, calibration_limit=4, progress=False)
    data = manifest.read(out)
    assert data["source"] == "default" and data["bits"] == {"weights": 8, "activations": 16}
    assert data["shapes"]["n_layer"] == 30 and manifest.problem(out) is None
    src = resolve_source("default")
    tokens = npu.fidelity_token_lists(AutoTokenizer.from_pretrained(str(src)), 63)[:1]
    score = npu.score_export(out, tokens, npu.reference_logits(src, tokens), npu.cpu_sessions)
    assert data["sink"]["text"] == "<|im_start|>"
    # four calibration prompts and one prompt: a floor against a broken export (RMSNorm spelled
    # out gave top-1 0.06, KL 9; before the sink, the padding and the decode calibration it
    # measured 0.92 / 0.10, after them 0.97 / 0.009), not the target (bench npu measures that)
    assert score["top1"] >= 0.9 and score["kl"] < 0.05, score
