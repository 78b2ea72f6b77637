"""CPU weight formats (:mod:`.formats`, one module each), their vLLM methods and the quantizer.

:func:`register` is called by the plugin in every vLLM process; it is idempotent and
only imports vLLM's light quantization registry (the layer code loads lazily).
"""

from __future__ import annotations

import logging
import threading

from vllm_edge.common.registration import Registration

_lock = threading.Lock()
_done: list[Registration] | None = None


def register() -> list[Registration]:
    """Register every weight format's vLLM quantization config (the registry's formats that
    vLLM lacks) once per process; returns what was registered."""
    global _done
    with _lock:
        if _done is not None:
            return list(_done)
        from vllm_edge.quant import formats

        _done = [_register_one(f) for f in formats.with_vllm_config()]
        return list(_done)


def _register_one(fmt) -> Registration:
    try:
        from vllm.model_executor.layers.quantization import (
            _CUSTOMIZED_METHOD_TO_QUANT_CONFIG,
            register_quantization_config,
        )

        cls = fmt.config_class()
        if _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(fmt.name) is not cls:
            register_quantization_config(fmt.name)(cls)
        state = "registered"
    except Exception as exc:  # an upstream API change must be visible, not fatal
        logging.getLogger("vllm_edge.quant").warning(
            "vllm-edge: cannot register quantization config %s: %s", fmt.name, exc)
        state = f"skipped: {exc}"
    target = "vllm.model_executor.layers.quantization:register_quantization_config"
    return Registration(name=fmt.name, kind="quantization_config", target=target, state=state)
