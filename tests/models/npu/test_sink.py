"""The attention sink: the first token's cache entries, computed once in float32, stand in for
running position 0. On the default model they give the same logits as running it, the first
position carries the residual's massive activation that the sink keeps out of the graphs, and
a sequence that does not start with the sink token, or a sink file of the wrong shape, is
refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_edge.models.npu import llama, runner, sink
from vllm_edge.models.npu.errors import NpuExportError


@pytest.fixture(scope="module")
def default_npu(default_model_dir):
    from transformers import AutoTokenizer

    shape = llama.read_shape(default_model_dir)
    model = llama.NpuLlama(shape, llama.load_weights(default_model_dir, shape), 64).eval()
    return model, AutoTokenizer.from_pretrained(default_model_dir)


def _chat(tok, text):
    from vllm_edge.models.npu.export import encode_chat

    return encode_chat(tok, text, 63)


def test_the_sink_token_is_the_chat_templates_first_and_none_without_one(default_npu):
    _, tok = default_npu
    token, why = sink.first_token(tok)
    assert tok.convert_ids_to_tokens(token) == "<|im_start|>" and "chat template" in why
    assert _chat(tok, "Anything at all?")[0] == token
    plain = tok.__class__.from_pretrained(tok.name_or_path)
    plain.chat_template = None  # no template and no BOS: sequences may start with anything
    token, why = sink.first_token(plain)
    assert token is None and "no BOS" in why


def test_the_sink_stands_in_for_running_position_zero(default_npu):
    model, tok = default_npu
    s = model.shape
    shape = runner.CacheShape(s.n_layer, s.n_kv, s.head_dim, model.context)
    graph = runner.torch_graph(model)
    the_sink = sink.compute(model, sink.first_token(tok)[0])
    assert the_sink.kv.shape == (2 * s.n_layer, 1, s.n_kv, 1, s.head_dim)
    ids = _chat(tok, "What is the capital of France?")
    full = runner.run(ids, shape, graph, 8, graph, n_prefill=len(ids) - 4)
    sunk = runner.run(ids, shape, graph, 8, graph, n_prefill=len(ids) - 4, sink=the_sink)
    assert sunk.shape == (len(ids) - 1, s.vocab)
    np.testing.assert_allclose(sunk, full[1:], atol=2e-3)
    assert (sunk.argmax(-1) == full[1:].argmax(-1)).all()


def test_position_zero_holds_the_residual_s_massive_activation(default_model_dir, default_npu):
    # what the sink keeps out of the 16-bit graphs: the residual stream at position 0 is far
    # larger than at any other position, whatever the first token is
    from transformers import LlamaForCausalLM

    _, tok = default_npu
    hf = LlamaForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    for ids in (tok("The quick brown fox jumps over the lazy dog.")["input_ids"],
                _chat(tok, "What is the capital of France?")):
        with torch.no_grad():
            hidden = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        peak = torch.stack(hidden[1:])[:, 0].abs().amax(-1).amax(0)  # per position, over layers
        assert peak[0] > 20 * peak[1:].max(), peak
    # token 0 (<|endoftext|>) raises it later in a sequence too: why a chunk is padded with its
    # last token instead
    ids = _chat(tok, "What is the capital of France?")
    with torch.no_grad():
        hidden = hf(torch.tensor([ids + [0, ids[-1]]]), output_hidden_states=True).hidden_states
    peak = torch.stack(hidden[1:])[:, 0].abs().amax(-1).amax(0)
    assert peak[-2] > 10 * peak[1:-2].max() and peak[-1] < 2 * peak[1:-2].max(), peak[-4:]


def test_a_sequence_without_the_sink_token_is_refused(default_npu):
    model, tok = default_npu
    s = model.shape
    shape = runner.CacheShape(s.n_layer, s.n_kv, s.head_dim, model.context)
    the_sink = sink.Sink(7, np.zeros((2 * s.n_layer, 1, s.n_kv, 1, s.head_dim), np.float32))
    with pytest.raises(NpuExportError, match="start with its sink token 7; this one starts with 9"):
        runner.run([9, 10, 11], shape, runner.torch_graph(model), 4, sink=the_sink)
    with pytest.raises(NpuExportError, match="nothing to run after the sink token"):
        runner.run([7], shape, runner.torch_graph(model), 4, sink=the_sink)


def test_a_missing_or_misshaped_sink_file_is_refused_by_name(tmp_path):
    m = {"sink": {"token": 1, "file": sink.FILE},
         "shapes": {"n_layer": 2, "n_kv_heads": 2, "head_dim": 16}}
    with pytest.raises(NpuExportError, match="sink file, but it is missing"):
        sink.load(tmp_path, m)
    sink.Sink(1, np.zeros((4, 1, 2, 1, 8), np.float32)).save(tmp_path)
    with pytest.raises(NpuExportError, match=rf"{sink.FILE}: shape \(4, 1, 2, 1, 8\)"):
        sink.load(tmp_path, m)
    sink.Sink(1, np.ones((4, 1, 2, 1, 16), np.float32)).save(tmp_path)
    assert sink.load(tmp_path, m).kv.sum() == 4 * 2 * 16
    assert sink.load(tmp_path, {"sink": None}) is None
