"""The functional Llama with the KV cache outside equals transformers' LlamaForCausalLM in fp32,
through the same chunked prefill + decode runner a phone app uses; shapes it cannot write are
refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vllm_edge.models.npu import llama, runner
from vllm_edge.models.npu.errors import NpuExportError


def test_matches_transformers_fp32(default_model_dir):
    from transformers import AutoTokenizer, LlamaForCausalLM

    shape = llama.read_shape(default_model_dir)
    model = llama.NpuLlama(shape, llama.load_weights(default_model_dir, shape), 32).eval()
    ids = AutoTokenizer.from_pretrained(default_model_dir)("The capital of France is Paris. "
                                                          "The capital of Germany is")["input_ids"]
    cache = runner.CacheShape(shape.n_layer, shape.n_kv, shape.head_dim, 32)
    graph = runner.torch_graph(model)
    # prefill chunks of 4 (the last one padded), then decode steps for the last 3 tokens
    ours = runner.run(ids, cache, graph, 4, graph, n_prefill=len(ids) - 3)
    hf = LlamaForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - ref).max() < 1e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def _folder(tmp_path, **cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("cfg, words", [
    ({"model_type": "gemma3", "architectures": ["Gemma3ForCausalLM"]}, "Llama family only"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "quantization_config": {"q": 1}},
     "quantized"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": True}, "biases"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
      "rope_scaling": {"rope_type": "llama3"}}, "rope scaling"),
])
def test_refuses_what_it_cannot_write(tmp_path, cfg, words):
    with pytest.raises(NpuExportError, match=words):
        llama.read_shape(_folder(tmp_path, **cfg))


def test_mask_and_positions_of_a_chunk():
    shape = runner.CacheShape(n_layer=1, n_kv=1, head_dim=2, context=8)
    feed = runner.inputs(runner.empty_cache(shape), 2, [5, 6], 3, shape)
    mask = feed["attention_mask"][0, 0]
    # 5 cache slots (2 valid), then the chunk of 3 causal within itself
    assert (mask[:, :2] == 0).all() and (mask[:, 2:5] == llama.MASK_VALUE).all()
    assert mask[0, 5] == 0 and mask[0, 6] == llama.MASK_VALUE and (mask[2, 5:8] == 0).all()
    assert feed["position_ids"].tolist() == [[2, 3, 4]] and feed["past_key.0"].shape == (1, 1, 5, 2)
    # the padding repeats the last token: token 0 (<|endoftext|>) would raise the residual's
    # massive activation in the padded row and widen every 16-bit scale of the chunk
    assert feed["input_ids"].tolist() == [[5, 6, 6]]
    with pytest.raises(NpuExportError, match="does not fit"):
        runner.inputs(runner.empty_cache(shape), 6, [1], 3, shape)
