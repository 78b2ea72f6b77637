"""Four-bit CPU weights: the ``cpu_int4`` (W4A16) method and its quantizer.

:func:`register` is called by the plugin in every vLLM process; it is idempotent and
only imports vLLM's light quantization registry (the layer code loads lazily).
"""

from __future__ import annotations

import logging
import threading

_lock = threading.Lock()
_done = False


def register() -> None:
    global _done
    with _lock:
        if _done:
            return
        from vllm_edge.plugin import Registration, _registrations

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
        if not any(r.name == "cpu_int4" for r in _registrations):
            _registrations.append(Registration(name="cpu_int4", kind="quantization_config",
                                               target=target, state=state))
        _done = True
