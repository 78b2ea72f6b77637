"""Kernel providers registered through vLLM's IR (``ir.ops.<op>.register_impl``).

A provider is a registration, not a patch: vLLM selects it only when
``kernel_config.ir_op_priority`` names it. :func:`register` is called by the
plugin in every vLLM process; it is idempotent.
"""

from __future__ import annotations


def register() -> None:
    from vllm_edge.kernels import rms_norm

    rms_norm.register()
