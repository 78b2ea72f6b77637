"""Import parity against llama.cpp (needs llama-cpp-python): our SmolLM2 import passes, and a
deliberately corrupted one is caught."""

from __future__ import annotations

import pytest

from support.checkpoints import copy_without_weights
from support.llamacpp import default_gguf, need_llama_cpp
from vllm_edge.bench.engines import llamacpp as llamacpp_runner
from vllm_edge.bench.llamacpp import verify as gguf_verify
from vllm_edge.bench.llamacpp.verify import VerifyConfig, compare

pytestmark = pytest.mark.slow

SMALL = VerifyConfig(prompt_ids=("chat-capital", "tool-weather"), chunks=1, chunk_len=512)


@pytest.fixture(scope="module")
def reference(default_model_dir, tmp_path_factory):
    """llama.cpp on an f32-dequantized copy of the source GGUF (the verdict's reference for a
    quantized source), fed the token ids of our imported tokenizer."""
    need_llama_cpp()
    from vllm_edge.bench.fidelity.hf_reference import HfRunner

    hf = HfRunner(default_model_dir)
    inputs = gguf_verify.build_inputs(hf, SMALL)
    f32 = gguf_verify.dequantized_copy(default_gguf(), tmp_path_factory.mktemp("deq") / "f32.gguf")
    assert llamacpp_runner.quantization_types(f32) == {"F32"}
    return hf, inputs, gguf_verify.llamacpp_reference(f32, inputs, SMALL)


def test_smollm2_import_passes(reference):
    hf, inputs, ref = reference
    report = compare(ref, gguf_verify.hf_candidate(hf, inputs, SMALL), inputs, SMALL, quantized=True)
    assert report["passed"], report["teacher_forced"]
    assert report["teacher_forced"]["top1_agreement"] >= 0.99
    assert report["tokenizer_agreement"]["identical"] == len(SMALL.prompt_ids)


def _corrupted_copy(src, dst, layers=(3, 4)):
    """The imported directory with two layers' attention tensors swapped."""
    from safetensors.torch import load_file, save_file

    copy_without_weights(src, dst)
    w = load_file(str(src / "model.safetensors"))
    a, b = layers
    for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
        ka, kb = f"model.layers.{a}.self_attn.{part}.weight", f"model.layers.{b}.self_attn.{part}.weight"
        w[ka], w[kb] = w[kb], w[ka]
    save_file(w, str(dst / "model.safetensors"))
    return dst


def test_parity_check_catches_a_corrupted_conversion(reference, default_model_dir, tmp_path):
    from vllm_edge.bench.fidelity.hf_reference import HfRunner

    _, inputs, ref = reference
    bad = HfRunner(_corrupted_copy(default_model_dir, tmp_path / "bad"))
    report = compare(ref, gguf_verify.hf_candidate(bad, inputs, SMALL), inputs, SMALL, quantized=True)
    assert not report["passed"]
    assert report["teacher_forced"]["top1_agreement"] < 0.95
