"""Kernel providers registered through vLLM's IR (``ir.ops.<op>.register_impl``).

A provider is a registration, not a patch: vLLM selects it only when
``kernel_config.ir_op_priority`` names it. :func:`register` is called by the
plugin in every vLLM process; it is idempotent.
"""

from __future__ import annotations

from vllm_edge.common.registration import Registration


def register() -> list[Registration]:
    """Register every provider once per process; returns what was registered."""
    from vllm_edge.kernels import rms_norm

    return rms_norm.register()
