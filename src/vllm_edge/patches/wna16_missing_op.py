"""GPTQ/AWQ checkpoints on a vLLM build without ``cpu_gemm_wna16`` (docs/design/patches.md).

vLLM 0.32.0 offers its CPU 4-bit kernel, ``CPUWNA16LinearKernel``, whenever the platform is a
CPU and the shapes fit, then calls ``torch.ops._C.cpu_gemm_wna16`` at the first forward. Its
AVX2 build (``vllm/_C_AVX2``, the one loaded on a CPU without AVX-512) has no such op, so on those
CPUs a GPTQ checkpoint loads its weights and then dies in the profiling run with
``'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'``. The patch makes the kernel
decline where the op is absent, with a reason naming the op, so vLLM refuses at load with its
list of kernels and why each one cannot run, before any weight is read. Where the op exists the
original answers unchanged. The op is looked up at the call, when vLLM has loaded its kernels.
"""

from __future__ import annotations

from typing import Any

from vllm_edge.patches import Patch

OP = "cpu_gemm_wna16"
REASON = (f"this CPU's vLLM kernel library (AVX2 build) has no {OP}; "
          "repack the checkpoint to cpu_int4 instead (vllm-edge models prepare --quant cpu_int4)")


def op_present() -> bool:
    import torch

    import vllm._custom_ops  # noqa: F401  loads this CPU's kernel library into torch.ops._C

    return hasattr(torch.ops._C, OP)


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    # the op's presence depends on the CPU, not on the release: decided at each call
    return False


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    func = getattr(original, "__func__", None)
    if func is None:
        raise LookupError(f"{owner.__name__}.{attr} is no longer a classmethod")

    def can_implement(cls: Any, c: Any) -> tuple[bool, str | None]:
        if not op_present():
            return False, REASON
        return func(cls, c)

    can_implement.__doc__ = func.__doc__
    can_implement.__vllm_edge_patch__ = "wna16_missing_op"
    return classmethod(can_implement)


PATCH = Patch(
    name="wna16_missing_op",
    target="vllm.model_executor.kernels.linear.mixed_precision.cpu:CPUWNA16LinearKernel.can_implement",
    reason=(
        f"vLLM offers its CPU W4A16 kernel on every CPU, but the AVX2 build has no {OP}: a GPTQ "
        "or AWQ checkpoint fails at the first forward instead of at load with a reason"
    ),
    fixed_when="never detected (the op is compiled per CPU build); re-check when the vLLM pin moves",
    env_switch="VLLM_EDGE_PATCH_WNA16_MISSING_OP",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
