"""The packed product of cpu_int8 as a C++ dispatcher op: ``torch.ops.vllm_edge.lowbit_linear``.

The Python custom op of :mod:`.int8_ops` goes dispatcher -> Python impl -> ctypes -> C, some
microseconds per call and about 90 packed layers per decode step on a small model's Q4_K_M
file. ``csrc/lowbit_op.cpp`` registers a CPU kernel that calls ``csrc/lowbit_gemv.c`` from the
dispatcher, both routes (the product up to 16 rows, W^T and a GEMM above) in C++.

As for the int4 op (:mod:`.native_op`, whose build this reuses): the schema, the fake impl and a
Python fallback are defined here, so a compiled graph that calls the op runs in any process that
defines it; the C++ kernel is built on first use, cached under ``$VLLM_EDGE_HOME/kernels``,
loaded with ``torch.ops.load_library`` and checked against the Python route on a probe. Any
failure is logged once and leaves the fallback: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from vllm_edge.quant import lowbit, native, native_op

logger = logging.getLogger("vllm_edge.quant")
OP = "lowbit_linear"
SCHEMA = f"{OP}(Tensor x, Tensor nibbles, Tensor high, Tensor scale, Tensor? zero, int group, int planes) -> Tensor"
C_SOURCE = lowbit.SOURCES[0]
CXX_SOURCE = Path(__file__).with_name("csrc") / "lowbit_op.cpp"

_lock = threading.Lock()
_library: torch.library.Library | None = None
_state = ""


def define(fallback: Callable[..., torch.Tensor]) -> None:
    """Define ``vllm_edge::lowbit_linear`` with its fake impl and ``fallback``, once per process."""
    global _library
    with _lock:
        if _library is not None:
            return
        lib = torch.library.Library(native_op.NAMESPACE, "FRAGMENT")
        lib.define(SCHEMA)
        torch.library.register_fake(f"{native_op.NAMESPACE}::{OP}", _fake, lib=lib)
        lib.impl(OP, fallback, "CompositeExplicitAutograd")
        _library = lib


def _fake(x, nibbles, high, scale, zero, group, planes):
    return x.new_empty((*x.shape[:-1], scale.shape[1]))


def _probe(path: Path, fallback: Callable[..., torch.Tensor]) -> None:
    """The loaded kernel must give the Python route's bits at one row and at 40, for 6-bit codes
    and for 8-bit ones, with the int8-activation switch set as the Python route's."""
    lib = lowbit.library()
    if lib is not None:
        op_lib = ctypes.CDLL(str(path))
        lowbit.set_act8(op_lib, bool(lib.edge_lowbit_act8()))
        native.set_prefetch(op_lib, "edge_lowbit")
    gen = torch.Generator().manual_seed(0)
    for lo in (32, 128):
        q = torch.randint(-lo, lo, (128, 64), dtype=torch.int16, generator=gen).to(torch.int8)
        s = (torch.rand(128, 4, generator=gen) * 1e-2).to(torch.float16)
        z = (torch.rand(128, 4, generator=gen) * 1e-2).to(torch.float16)
        p = lowbit.pack(q, s, z, 16)
        for m in (1, 40):
            x = torch.randn(m, 64, generator=gen).to(torch.bfloat16)
            args = (x, p.nibbles, p.high, p.scale, p.zero, 16, p.planes)
            got = getattr(torch.ops, native_op.NAMESPACE).lowbit_linear.default(*args)
            if not torch.equal(got, fallback(*args)):
                raise RuntimeError(f"its output differs from the Python route at {m} rows, {p.planes} planes")


def _unavailable() -> str | None:
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_INT4_NATIVE_OP"):
        return "off (VLLM_EDGE_INT4_NATIVE_OP=0)"
    if not lowbit.supported():
        return "not used: the packed product does not run here"
    if native._compiler() is None or native_op.cxx_compiler() is None:
        return "unavailable: no C and C++ compiler found"
    return None


@functools.cache
def load(fallback: Callable[..., torch.Tensor]) -> bool:
    """Build (first use) and load the C++ kernel; whether the op runs it. Needs :func:`define`."""
    global _state
    why = _unavailable()
    if why is not None:
        _state = why
        if why.startswith("unavailable"):
            logger.warning("cpu_int8: the packed op %s; packed layers keep the Python op", why)
        return False
    cc, cxx = native._compiler(), native_op.cxx_compiler()
    path = native_op.cached_path(cc, cxx, C_SOURCE, CXX_SOURCE, "lowbitop")
    err = native_op.build_load_probe(
        "cpu_int8: the packed op (quant/csrc/lowbit_op.cpp)", path,
        lambda: native_op.build(cc, cxx, path, C_SOURCE, CXX_SOURCE), lambda: _probe(path, fallback),
        "packed layers keep the Python op")
    _state = f"failed: {err[-300:]}" if err else f"loaded ({path})"
    return err is None


def state() -> str:
    return _state or "not loaded"
