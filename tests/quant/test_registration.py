"""The plugin registers cpu_int4 through vLLM's real extension point, once."""

from __future__ import annotations


def test_register_is_idempotent_and_recorded():
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    from vllm_edge import plugin, quant
    from vllm_edge.quant.config import CpuInt4Config

    plugin.register()
    quant.register()
    quant.register()
    assert get_quantization_config("cpu_int4") is CpuInt4Config
    assert QUANTIZATION_METHODS.count("cpu_int4") == 1
    regs = [r for r in plugin.registrations() if r.name == "cpu_int4"]
    assert len(regs) == 1
    assert regs[0].kind == "quantization_config" and regs[0].state == "registered"


def test_config_round_trip():
    from vllm_edge.quant.config import CpuInt4Config

    cfg = CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 64,
                                     "prefill_dequant": False, "dequant_threshold": 8})
    assert cfg.group_size == 64 and not cfg.prefill_dequant and cfg.quantize_embedding
    assert CpuInt4Config.from_config(cfg.to_dict()).to_dict() == cfg.to_dict()
    assert CpuInt4Config.override_quantization_method({"quant_method": "cpu_int4"}, None) == "cpu_int4"


def test_dequant_threshold_auto_and_bad_values():
    import pytest

    from vllm_edge.quant import ops
    from vllm_edge.quant.config import CpuInt4Config

    auto = CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32})
    assert auto.dequant_threshold == "auto" and auto.effective_threshold == ops.AUTO
    assert auto.to_dict()["dequant_threshold"] == "auto"
    assert CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32,
                                      "dequant_threshold": 48}).effective_threshold == 48
    assert CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32, "prefill_dequant": False,
                                      "dequant_threshold": "auto"}).effective_threshold == ops.NEVER
    for bad in (-1, "fast", 1.5, True):
        with pytest.raises(ValueError, match="dequant_threshold must be an integer >= 0 or \"auto\""):
            CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32, "dequant_threshold": bad})
