"""CPU attention without AMX tiles (docs/design/patches.md).

vLLM 0.32.0 picks its AMX attention kernel (``cpu_attn_amx.hpp``) for bf16 on any CPU with
AMX (``cpu_attn._get_attn_isa``). That kernel runs tile instructions on OpenMP worker threads
that have not loaded a tile configuration of their own: with bf16 weights oneDNN's AMX GEMMs
happen to configure the tiles of every worker first, but with ``cpu_int4`` (no oneDNN in the
linears) a worker reaches ``tilezero`` unconfigured and the process dies with SIGILL (seen in
gdb: ``TileGemm224::gemm`` in a libgomp worker thread, ``bench speed``/``bench profile`` on an
AMX Xeon). The patch makes the choice fall back to the AVX-512 kernel (``vec``), which vLLM
uses on every other x86 CPU. The bug is in compiled code, so no probe can show it fixed; the
patch stands down only through its switch, and a vLLM bump must re-check it.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_edge.patches import Patch


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    return False


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    @functools.wraps(original)
    def _get_attn_isa(*args: Any, **kwargs: Any) -> str:
        isa = original(*args, **kwargs)
        return "vec" if isa == "amx" else isa

    _get_attn_isa.__vllm_edge_patch__ = "amx_attention"
    return _get_attn_isa


PATCH = Patch(
    name="amx_attention",
    target="vllm.v1.attention.backends.cpu_attn:_get_attn_isa",
    reason=(
        "the AMX attention kernel runs tile instructions on OpenMP workers without a tile "
        "configuration; with cpu_int4 linears (no oneDNN AMX to configure them first) the "
        "process dies with SIGILL"
    ),
    fixed_when="never detected (compiled code); re-check when the vLLM pin moves",
    env_switch="VLLM_EDGE_PATCH_AMX_ATTENTION",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
