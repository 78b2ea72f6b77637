"""Four-bit CPU weights: the ``cpu_int4`` (W4A16) method and its quantizer.

:func:`register` is called by the plugin in every vLLM process; it is idempotent and
only imports vLLM's light quantization registry (the layer code loads lazily).
"""

from __future__ import annotations

import logging
import threading

from vllm_edge.common.registration import Registration

_lock = threading.Lock()
_done: Registration | None = None


def register() -> list[Registration]:
    """Register ``cpu_int4`` with vLLM once per process; returns what was registered."""
    global _done
    with _lock:
        if _done is not None:
            return [_done]
        try:
            from vllm.model_executor.layers.quantization import (
                _CUSTOMIZED_METHOD_TO_QUANT_CONFIG,
                register_quantization_config,
            )

            from vllm_edge.quant.config import NAME, CpuInt4Config

            if _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(NAME) is not CpuInt4Config:
                register_quantization_config(NAME)(CpuInt4Config)
            state = "registered"
        except Exception as exc:  # an upstream API change must be visible, not fatal
            logging.getLogger("vllm_edge.quant").warning(
                "vllm-edge: cannot register quantization config cpu_int4: %s", exc)
            state = f"skipped: {exc}"
        target = "vllm.model_executor.layers.quantization:register_quantization_config"
        _done = Registration(name="cpu_int4", kind="quantization_config", target=target, state=state)
        return [_done]
