"""build-vlm and its cpu_int4 quantization on a tiny VLM (a 1-layer random Llama with the
real tokenizer, and a 1-layer vision tower): names, vocabulary, processor without
torchvision, and what the quantizer keeps in bf16 and why."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from vllm_edge.models import synthetic, vlm
from vllm_edge.quant.groups import DEFAULT_GROUP
from vllm_edge.quant.quantize import quantize_model

TINY = vlm.VisionShape(hidden=64, layers=1, intermediate=128, heads=2, patch=16, image_size=64,
                       scale_factor=2, longest_edge=64)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("vlm")
    text = synthetic.build(root / "text", synthetic.Shape.derive(64, 1, 49152),
                           tokenizer_from=default_model_dir, progress=False)
    return vlm.build(root / "bf16", text_dir=text, vision=TINY)


def names(path):
    out = {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: tuple(h.get_slice(n).get_shape()) for n in h.keys()})
    return out


def test_layout_vocab_and_config(tiny_vlm):
    cfg = json.loads((tiny_vlm / "config.json").read_text())
    t = names(tiny_vlm)
    assert cfg["architectures"] == ["Idefics3ForConditionalGeneration"]
    vocab = cfg["text_config"]["vocab_size"]
    assert vocab == 49216 and vocab % vlm.VOCAB_MULTIPLE == 0  # 49152 + 40 image tokens, padded
    assert t["model.text_model.embed_tokens.weight"] == (vocab, 64) == t["lm_head.weight"]
    assert cfg["image_token_id"] == 49153
    assert t["model.connector.modality_projection.proj.weight"] == (64, 64 * 4)
    assert t["model.vision_model.encoder.layers.0.self_attn.q_proj.weight"] == (64, 64)
    assert not any(n.startswith("model.layers.") for n in t)  # all text weights renamed


def test_processor_loads_without_torchvision(tiny_vlm):
    code = f"""
import sys
sys.modules['torchvision'] = None  # importing it now raises, as if not installed
from transformers import AutoProcessor
from PIL import Image
p = AutoProcessor.from_pretrained({str(tiny_vlm)!r})
enc = p(text='<image>hi', images=[Image.new('RGB', (100, 60), 'red')])
ids = list(enc['input_ids'][0])
print(type(p.image_processor).__name__, p.image_seq_len, ids.count(p.image_token_id),
      len(enc['pixel_values'][0]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    cls, seq, n_image, tiles = out.stdout.split()[-4:]
    assert cls == "Idefics3ImageProcessorPil"
    assert int(seq) == TINY.image_seq_len == 4 and int(n_image) == 4 and int(tiles) == 1


def quantized(tiny_vlm, tmp_path, vision):
    out = quantize_model(tiny_vlm, tmp_path / f"q{vision}", group=DEFAULT_GROUP, quantize_vision=vision,
                         progress=False)
    return out, json.loads((out / "quantization_report.json").read_text()), names(out)


def test_language_model_quantized_vision_kept(tiny_vlm, tmp_path):
    out, rep, t = quantized(tiny_vlm, tmp_path, False)
    q = rep["quantization_config"]
    assert q["quantize_vision"] is False
    assert set(q["modules_to_not_convert"]) >= {"model.connector", "model.vision_model"}
    assert "model.text_model.layers.0.self_attn.q_proj.weight_packed" in t
    assert "lm_head.weight_packed" in t and "model.text_model.embed_tokens.weight_packed" in t
    assert "model.vision_model.encoder.layers.0.mlp.fc1.weight" in t
    kept = {k["name"]: k["reason"] for k in rep["kept_bf16"]}
    assert "connector" in kept["model.connector.modality_projection.proj.weight"]
    assert "quantize_vision=false" in kept["model.vision_model.encoder.layers.0.mlp.fc1.weight"]
    assert "not a linear" in kept["model.vision_model.embeddings.position_embedding.weight"]


def test_quantize_vision_packs_the_tower(tiny_vlm, tmp_path):
    out, rep, t = quantized(tiny_vlm, tmp_path, True)
    assert rep["quantization_config"]["quantize_vision"] is True
    assert "model.vision_model" not in rep["quantization_config"]["modules_to_not_convert"]
    assert "model.vision_model.encoder.layers.0.self_attn.k_proj.weight_packed" in t
    assert "model.vision_model.encoder.layers.0.self_attn.k_proj.bias" in t  # biases stay
    assert "model.connector.modality_projection.proj.weight" in t  # still bf16
    assert "model.vision_model.embeddings.position_embedding.weight" in t


def test_unsupported_shape_stays_bf16_with_its_fused_siblings(default_model_dir, tmp_path):
    text = synthetic.build(tmp_path / "text", synthetic.Shape.derive(64, 1, 49152),
                           tokenizer_from=default_model_dir, progress=False)
    # vision hidden 72: 72 output rows is not a multiple of 16, so tinygemm cannot pack
    # q/k/v/out (72x72) nor fc2 (72x128); fc1 (128x72) has no group dividing K=72 (g32 or g64).
    shape = vlm.VisionShape(hidden=72, layers=1, intermediate=128, heads=2, patch=16,
                            image_size=64, scale_factor=2, longest_edge=64)
    src = vlm.build(tmp_path / "bf16", text_dir=text, vision=shape)
    out = quantize_model(src, tmp_path / "q", group=DEFAULT_GROUP, quantize_vision=True, progress=False)
    rep = json.loads((out / "quantization_report.json").read_text())
    kept = {k["name"]: k["reason"] for k in rep["kept_bf16"]}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert "unsupported shape 72x72" in kept[f"model.vision_model.encoder.layers.0.self_attn.{proj}.weight"]
    assert "model.vision_model.encoder.layers.0.self_attn.q_proj" in \
        rep["quantization_config"]["modules_to_not_convert"]


def test_quantize_vision_on_a_text_model_is_an_error(default_model_dir, tmp_path):
    with pytest.raises(ValueError, match="no vision_config"):
        quantize_model(default_model_dir, tmp_path / "q", quantize_vision=True, progress=False)


def test_config_fused_layer_skip():
    from vllm_edge.quant.config import CpuInt4Config

    cfg = CpuInt4Config(group_size=64, modules_to_not_convert=["model.vision_model", "a.k_proj"],
                        quantize_vision=False)
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert cfg._skipped("model.vision_model.encoder.layers.0.self_attn.qkv_proj")
    assert not cfg._skipped("model.text_model.layers.0.self_attn.qkv_proj")
    with pytest.raises(ValueError, match="only some parts of the fused layer a.qkv_proj"):
        cfg._skipped("a.qkv_proj")
    assert CpuInt4Config.from_config(cfg.to_dict()).quantize_vision is False
    assert "quantize_vision" not in CpuInt4Config(group_size=64).to_dict()
