"""A tiny Llama folder (real tokenizer, random weights) for the NPU export's fast tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama(default_model_dir, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from support.npu import tiny_llama

    return tiny_llama(default_model_dir, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_export(tiny_llama, tmp_path_factory):
    """The tiny Llama exported w8a16 at context 16, prefill 4, on two calibration prompts."""
    pytest.importorskip("onnxruntime.quantization")
    from vllm_edge.models.npu.export import export_npu

    return export_npu(tiny_llama, tmp_path_factory.mktemp("npu") / "tiny", context=16, prefill=4,
                      calibration_limit=2, progress=False)
