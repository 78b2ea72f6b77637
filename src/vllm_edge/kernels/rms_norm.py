"""The ``edge_cpu`` provider of vLLM's ``rms_norm`` and ``fused_add_rms_norm`` IR ops.

vLLM 0.32 registers its fused ``_C`` norm kernels only for CUDA-alike and XPU
platforms (``vllm/kernels/vllm_c.py``), although the CPU build ships both
(``_C::rms_norm(out, input, weight?, eps)``, ``_C::fused_add_rms_norm(input!,
residual!, weight?, eps)``). This module registers them for CPU under the
provider name :data:`PROVIDER`.

Registered is not selected. vLLM dispatches to a provider only when
``kernel_config.ir_op_priority`` lists it first (``--ir-op-priority`` on the
CLI). Inductor already fuses the native norm with the residual add, so an
opaque kernel can lose end to end; whether vllm-edge's own engines put it first
is the switch ``VLLM_EDGE_RMSNORM_PROVIDER`` (off by default; the evidence is
in docs/reference/configuration.md).
"""

# No `from __future__ import annotations`: vLLM infers each impl's torch schema
# from its annotations and requires it to equal the native one.

import logging

from vllm_edge.common.registration import Registration

PROVIDER = "edge_cpu"
OPS = ("rms_norm", "fused_add_rms_norm")
ENV_SWITCH = "VLLM_EDGE_RMSNORM_PROVIDER"
# The kernels check hidden_size % VEC_ELEM_NUM == 0 and raise otherwise; probed
# here (AVX-512 build) that is 8 for all three dtypes. 16 also covers a build
# with wider vectors; a shape it refuses goes to native, which is always correct.
HIDDEN_MULTIPLE = 16

logger = logging.getLogger("vllm_edge.kernels")

_state: dict[str, str] = {}  # op -> "registered" | "registered (unsupported: ...)" | "skipped: ..."


def kernels_present() -> tuple[bool, str]:
    """Whether this vLLM build is the CPU one and its ``_C`` library has both kernels."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False, f"platform is {current_platform.device_name!r}, not cpu"
    current_platform.import_kernels()
    missing = [op for op in OPS if not hasattr(torch.ops._C, op)]
    if missing:
        return False, f"this vLLM CPU build has no torch.ops._C.{', _C.'.join(missing)}"
    return True, "torch.ops._C.rms_norm and _C.fused_add_rms_norm present"


def impls() -> dict:
    """op name -> (impl, supports_args, inplace). Built on demand so that importing
    this module (the engine builder does, before torch) does not import torch."""
    import torch
    from torch import Tensor

    dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def fits(x: Tensor, weight: Tensor | None, variance_size: int | None) -> bool:
        # The kernels read rows as contiguous memory: a strided view gives wrong
        # numbers, not an error, so contiguity is checked, never assumed.
        return (
            variance_size is None
            and x.device.type == "cpu"
            and x.dtype in dtypes
            and x.dim() >= 1
            and x.shape[-1] % HIDDEN_MULTIPLE == 0
            and x.is_contiguous()
            and (weight is None or (weight.dtype == x.dtype and weight.is_contiguous()
                                    and weight.dim() == 1 and weight.shape[0] == x.shape[-1]))
        )

    def rms_norm_fits(x: Tensor, weight: Tensor | None, epsilon: float,
                      variance_size: int | None = None) -> bool:
        return fits(x, weight, variance_size)

    def fused_add_rms_norm_fits(x: Tensor, x_residual: Tensor, weight: Tensor | None,
                                epsilon: float, variance_size: int | None = None) -> bool:
        return (fits(x, weight, variance_size) and x_residual.dtype == x.dtype
                and x_residual.shape == x.shape and x_residual.is_contiguous())

    def rms_norm(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.ops._C.rms_norm(out, x, weight, epsilon)
        return out

    def fused_add_rms_norm(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        # In place: x becomes norm(x + residual), x_residual becomes x + residual.
        torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
        return x, x_residual

    return {"rms_norm": (rms_norm, rms_norm_fits, False),
            "fused_add_rms_norm": (fused_add_rms_norm, fused_add_rms_norm_fits, True)}


def register() -> list[Registration]:
    """Register both impls once per process; returns what was registered."""
    if not _state:
        _register()
    return [Registration(name=f"{op_name}:{PROVIDER}", kind="ir_impl",
                         target=f"vllm.ir.ops.{op_name}:register_impl", state=_state[op_name])
            for op_name in OPS]


def _register() -> None:
    try:
        from vllm import ir

        supported, why = kernels_present()
        for op_name, (fn, fits, inplace) in impls().items():
            op = getattr(ir.ops, op_name)
            if PROVIDER not in op.impls:
                op.register_impl(PROVIDER, supported=supported, supports_args=fits,
                                 inplace=inplace)(fn)
            _state[op_name] = "registered" if supported else f"registered (unsupported: {why})"
    except Exception as exc:  # an upstream API change must be visible, not fatal
        logger.warning("vllm-edge: cannot register the %s norm provider: %s", PROVIDER, exc)
        for op_name in OPS:
            _state.setdefault(op_name, f"skipped: {exc}")


def supported() -> bool:
    return all(s == "registered" for s in (_state.get(op) for op in OPS))


def opted_in() -> bool:
    from vllm_edge import envs

    return bool(envs.get(ENV_SWITCH))


def engine_priority() -> dict[str, list[str]] | None:
    """What vllm-edge's engine builder passes as ``ir_op_priority``; None leaves
    vLLM's CPU default (``native`` only). Decided by the switch alone: vLLM skips
    a provider registered as unsupported, so an unsupported build runs native."""
    if not opted_in():
        return None
    return {op: [PROVIDER, "native"] for op in OPS}


def _vllm_default() -> dict[str, list[str]]:
    from vllm.platforms import current_platform

    # The CPU platform's default ignores the config argument.
    prio = current_platform.get_default_ir_op_priority(None)
    return {op: list(getattr(prio, op)) for op in OPS}


def describe() -> dict:
    """For `doctor`: the provider, whether it can run here, and whether it is in
    the default priority of vllm-edge's engines."""
    register()
    prio = engine_priority() if supported() else None
    return {
        "provider": PROVIDER,
        "ops": {op: _state.get(op, "not registered") for op in OPS},
        "supported": supported(),
        "switch": f"{ENV_SWITCH}={'1' if opted_in() else '0'}",
        "in_default_priority": prio is not None,
        "default_priority": prio or _vllm_default(),
        "opt_in": f"{ENV_SWITCH}=1, or --ir-op-priority "
                  + "'{" + ", ".join(f'"{op}": ["{PROVIDER}", "native"]' for op in OPS) + "}'",
    }
