"""The NPU fidelity check can fail: a deliberately mis-scaled export (its weight scales
multiplied) misses the targets, the honest one of the same model meets them; the metrics
themselves on known distributions."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from vllm_edge.bench import npu

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")


def test_compare_and_check():
    ref = np.array([[4.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    assert npu.compare(ref, ref) == {"top1": 1.0, "kl": 0.0, "positions": 2}
    worse = npu.compare(ref, np.array([[0.0, 4.0, 0.0], [0.0, 4.0, 0.0]]))
    assert worse["top1"] == 0.5 and worse["kl"] > 1
    assert npu.check(worse) == ["top-1 0.500 < 0.95", f"KL {worse['kl']:.4f} > 0.02"]


def _misscale(build, dest, factor):
    """A copy of ``build`` whose linear-layer weight scales are multiplied by ``factor``."""
    shutil.copytree(build, dest)
    for g in ("prefill", "decode"):
        path = dest / f"{g}.onnx"
        m = onnx.load(str(path))
        inits = {i.name: i for i in m.graph.initializer}
        matmul_w = {n.input[1] for n in m.graph.node if n.op_type == "MatMul"}
        for n in m.graph.node:
            if n.op_type == "DequantizeLinear" and n.input[0] in inits and set(n.output) & matmul_w:
                scale = inits[n.input[1]]
                arr = onnx.numpy_helper.to_array(scale) * np.float32(factor)
                scale.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), scale.name))
        onnx.save(m, str(path))
    return dest


def test_misscaled_export_fails_the_check(default_model_dir, tmp_path):
    from support.npu import tiny_llama
    from transformers import AutoTokenizer

    from vllm_edge.models.npu.export import export_npu

    src = tiny_llama(default_model_dir, tmp_path / "tiny")
    build = export_npu(src, tmp_path / "w8a16", context=32, prefill=8, calibration_limit=2, progress=False)
    tokens = npu.fidelity_token_lists(AutoTokenizer.from_pretrained(str(src)), 31)[:2]
    refs = npu.reference_logits(src, tokens)
    honest = npu.score_export(build, tokens, refs, npu.cpu_sessions)
    assert npu.check(honest) == [], honest
    bad = npu.score_export(_misscale(build, tmp_path / "bad", 3.0), tokens, refs, npu.cpu_sessions)
    assert npu.check(bad), bad
