"""quantization_config is read strictly: a wrong type names the field instead of being coerced."""

from __future__ import annotations

import pytest

from vllm_edge.quant.config import CpuInt4Config

BASE = {"quant_method": "cpu_int4", "group_size": 32}


@pytest.mark.parametrize("field, value, message", [
    ("quantize_embedding", "false", "quantization_config.quantize_embedding='false'; expected true or false"),
    ("prefill_dequant", 0, "quantization_config.prefill_dequant=0; expected true or false"),
    ("modules_to_not_convert", "lm_head", "quantization_config.modules_to_not_convert='lm_head'; expected a list"),
    ("group_size", "32", "quantization_config.group_size='32' is not supported"),
    ("group_size", True, "quantization_config.group_size=True is not supported"),
    ("dequant_threshold", "48", "quantization_config.dequant_threshold must be an integer >= 0"),
    ("dequant_workspace_mb", 0, "dequant_workspace_mb must be >= 1"),
])
def test_wrong_types_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        CpuInt4Config.from_config({**BASE, field: value})


def test_missing_group_size_is_named():
    with pytest.raises(ValueError, match="group_size is missing"):
        CpuInt4Config.from_config({"quant_method": "cpu_int4"})


def test_good_values_still_load():
    cfg = CpuInt4Config.from_config({**BASE, "quantize_embedding": False, "dequant_threshold": 48,
                                     "modules_to_not_convert": ["lm_head"]})
    assert cfg.quantize_embedding is False and cfg.modules_to_not_convert == ["lm_head"]


@pytest.mark.parametrize("value, message", [
    ("x", "layer_formats='x'; expected an object"),
    ({"m.q_proj": {"format": "fp8", "group_size": 32}}, r"layer_formats\['m.q_proj'\].format='fp8'; expected one of \['cpu_int8'\]"),
    ({"m.q_proj": {"format": "cpu_int4", "group_size": 32}}, r"format='cpu_int4'"),
    ({"m.q_proj": {"format": "cpu_int8", "group_size": 24}}, r"group_size=24; cpu_int8 takes \(16, 32, 64, 128\)"),
    ({"m.q_proj": {"format": "cpu_int8"}}, r"group_size=None"),
])
def test_layer_formats_are_read_strictly(value, message):
    with pytest.raises(ValueError, match=message):
        CpuInt4Config.from_config({**BASE, "layer_formats": value})


def test_the_parts_of_a_fused_layer_must_agree_on_their_format():
    cfg = CpuInt4Config.from_config({**BASE, "layer_formats": {
        "model.layers.0.self_attn.q_proj": {"format": "cpu_int8", "group_size": 16},
        "model.layers.0.self_attn.k_proj": {"format": "cpu_int8", "group_size": 16}}})
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    with pytest.raises(ValueError, match=r"fused layer model.layers.0.self_attn.qkv_proj different formats"):
        cfg._layer_format("model.layers.0.self_attn.qkv_proj")
    assert cfg._layer_format("model.layers.0.mlp.down_proj") is None
    assert cfg.to_dict()["layer_formats"] == cfg.layer_formats


def test_cpu_int8_config_is_read_strictly():
    from vllm_edge.quant.int8_config import CpuInt8Config

    ok = CpuInt8Config.from_config({"quant_method": "cpu_int8", "group_size": 16})
    assert ok.group_size == 16 and ok.to_dict()["bits"] == 8
    for bad, message in (({"group_size": 24}, "group_size=24 is not supported"),
                         ({}, "group_size is missing"), ({"group_size": 32, "bits": 4}, "only 8"),
                         ({"group_size": 32, "quantize_embedding": "no"}, "expected true or false")):
        with pytest.raises(ValueError, match=message):
            CpuInt8Config.from_config({"quant_method": "cpu_int8", **bad})
