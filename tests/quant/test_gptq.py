"""`--quant gptq`: the standard GPTQ packing (checked bit by bit), symmetric RTN, the untied head."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_edge.models import synthetic
from vllm_edge.quant import gptq
from vllm_edge.quant.quantize import REPORT_NAME, quantize_model


def _llama(tmp_path, hidden, name="tiny"):
    tok = tmp_path / "tok"
    tok.mkdir(exist_ok=True)
    (tok / "tokenizer.json").write_text("{}")
    shape = synthetic.Shape.derive(hidden, 1, 512, intermediate=256, heads=hidden // 64, kv_heads=1)
    return synthetic.build(tmp_path / name, shape, tokenizer_from=tok, progress=False)


@pytest.fixture
def tiny_llama(tmp_path):
    return _llama(tmp_path, 128)


def test_packing_is_gptq_v1_nibble_order():
    n, k, group = 16, 64, 32
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scale = torch.rand(n, k // group) + 0.5
    t = gptq.pack(q, scale, group)
    assert t["qweight"].dtype == torch.int32 and t["qweight"].shape == (k // 8, n)
    assert t["qzeros"].shape == (k // group, n // 8) and t["scales"].dtype == torch.float16
    assert t["g_idx"].tolist() == [i // group for i in range(k)]
    # by hand: nibble j of qweight[i, c] is q[c, 8i + j]
    for i, c, j in [(0, 0, 0), (0, 0, 7), (3, 5, 4), (7, 15, 7)]:
        word = int(t["qweight"][i, c]) & 0xFFFFFFFF
        assert (word >> (4 * j)) & 0xF == int(q[c, 8 * i + j])
    # symmetric: every stored zero is 8 - 1 (v1), i.e. 0x77777777
    assert set(t["qzeros"].flatten().tolist()) == {0x77777777}
    assert torch.equal(t["scales"].float(), scale.t().half().float())


def test_dequantize_reads_back_the_affine_values():
    n, k, group = 32, 128, 64
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scale = (torch.rand(n, k // group) + 0.1).to(torch.bfloat16).float()
    w = gptq.dequantize(gptq.pack(q, scale, group))
    expect = (q.float() - 8) * scale.repeat_interleave(group, dim=1)
    assert torch.equal(w, expect)


def test_quantize_sym_error_and_bf16_exact_scales():
    w = torch.randn(64, 256) * 0.05
    q, scale = gptq.quantize_sym(w, 64)
    assert q.max() <= 15 and torch.equal(scale, scale.to(torch.bfloat16).float())
    assert torch.equal(scale.half().float(), scale)  # stored fp16, read bf16: both exact
    deq = gptq.dequantize(gptq.pack(q, scale, 64))
    snr = 10 * torch.log10(w.pow(2).sum() / (w - deq).pow(2).sum())
    assert snr > 17  # 4-bit symmetric RTN on Gaussian weights: ~19-20 dB
    zeros = torch.zeros(32, 64)
    q0, s0 = gptq.quantize_sym(zeros, 64)
    assert torch.equal(gptq.dequantize(gptq.pack(q0, s0, 64)), zeros)


def test_shape_errors_name_the_tensor():
    with pytest.raises(ValueError, match="q_proj.*576.*group 128"):
        gptq.check_shape("model.layers.0.self_attn.q_proj.weight", 576, 576, 128)
    with pytest.raises(ValueError, match="multiples of 8"):
        gptq.check_shape("x.weight", 12, 64, 64)


@pytest.mark.parametrize("group", [64, 32])
def test_export_writes_a_gptq_checkpoint(tiny_llama, tmp_path, group):
    from safetensors import safe_open

    dst = quantize_model(tiny_llama, tmp_path / "g", scheme="gptq", group=group, progress=False)
    cfg = json.loads((dst / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["group_size"], qc["desc_act"], qc["sym"], qc["lm_head"]) == \
        ("gptq", 4, group, False, True, True)
    assert cfg["tie_word_embeddings"] is False
    assert json.loads((dst / "quantize_config.json").read_text()) == qc
    with safe_open(str(dst / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        emb = f.get_tensor("model.embed_tokens.weight")
        head = {s: f.get_tensor(f"lm_head.{s}") for s in ("qweight", "qzeros", "scales", "g_idx")}
    assert emb.dtype == torch.bfloat16  # the embedding stays bf16
    assert {"lm_head.qweight", "model.layers.0.mlp.down_proj.g_idx"} <= names
    assert not any(n.endswith("proj.weight") for n in names)
    assert head["qweight"].shape == (128 // 8, 512)
    assert head["scales"].shape == (128 // group, 512) and head["qzeros"].shape == (128 // group, 512 // 8)
    ref = gptq.dequantize(head)
    assert 10 * torch.log10(emb.float().pow(2).sum() / (emb.float() - ref).pow(2).sum()) > 15
    report = json.loads((dst / REPORT_NAME).read_text())
    assert report["head_untied"] is True and report["scheme"] == "gptq"
    by_name = {r["name"]: r for r in report["tensors"]}
    assert "model.embed_tokens.weight" not in by_name
    # 4 bits + fp16 scale and 4-bit zero per group + int32 g_idx per output row
    assert by_name["lm_head.weight"]["bits_per_weight"] == pytest.approx(4 + 20 / group + 32 / 512)


def test_export_refuses_a_group_that_does_not_divide(tmp_path):
    src = _llama(tmp_path, 192)
    with pytest.raises(ValueError, match="lm_head.weight has 192 input columns, not a multiple of group 128.*also: .*q_proj"):
        quantize_model(src, tmp_path / "g", scheme="gptq", group=128, progress=False)
    assert not (tmp_path / "g").exists()
