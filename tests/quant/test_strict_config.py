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
