"""The native int4 product as a C++ dispatcher op: ``torch.ops.vllm_edge.int4_gemv``.

Through the Python custom op, every cpu_int4 linear call goes dispatcher -> Python impl ->
``native.gemv`` -> ctypes -> ``edge_int4_gemv``, microseconds per call and 120 calls per
decode step on SmolLM2. ``csrc/int4_op.cpp`` registers a CPU kernel that calls the same C
function straight from the dispatcher; layers whose every batch runs the product call it
(``ops.native_op_for``), the others keep the Python op.

The schema, the fake impl and a Python fallback impl are defined here (:func:`define`), not
in C++: the op exists in every process that registers the cpu_int4 ops, so a compiled graph
cached by a process that had the C++ kernel still runs (on the fallback) in one that has not.

Built like ``native.py`` builds the C library: on first use, ``int4_gemv.c`` compiled as C
into an object and linked with ``int4_op.cpp`` against torch's libraries by the system C++
compiler, cached under ``$VLLM_EDGE_HOME/kernels`` keyed by the sources, the compilers,
the flags, torch's version and ABI and the CPU's ISA flags, and loaded with
``torch.ops.load_library``. It is built only where the native product runs
(``native.gemv_supported``). Any failure (no compiler, build error, a kernel that disagrees
with ``native.gemv`` on a probe) is logged once and leaves the Python op: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant import native

logger = logging.getLogger("vllm_edge.quant")
# the line a server's log gets when an op is built; `run` shows it as a phase (serving/startup_phases.py)
BUILDING = "%s: building it once for this torch and CPU; this takes tens of seconds"
NAMESPACE = "vllm_edge"
OP = "int4_gemv"
SCHEMA = f"{OP}(Tensor x, Tensor packed, Tensor scales_zeros, int group_size) -> Tensor"
C_SOURCE = Path(__file__).with_name("csrc") / "int4_gemv.c"
CXX_SOURCE = Path(__file__).with_name("csrc") / "int4_op.cpp"
# Only the full set: without -march=native there is no AVX512-BF16 product to call, and
# without -fopenmp it would run on one thread.
FLAGS = ["-O3", "-march=native", "-fopenmp"]
BUILD_TIMEOUT_S = 900  # torch's headers take tens of seconds on two busy cores

_lock = threading.Lock()
_library: torch.library.Library | None = None
_state = ""  # what load() found, for describe()


def define(fallback: Callable[..., torch.Tensor]) -> None:
    """Define ``vllm_edge::int4_gemv`` with its fake impl and ``fallback`` (Python, used
    wherever the C++ CPU kernel is not loaded), once per process."""
    global _library
    with _lock:
        if _library is not None:
            return
        lib = torch.library.Library(NAMESPACE, "DEF")
        lib.define(SCHEMA)
        torch.library.register_fake(f"{NAMESPACE}::{OP}", _fake, lib=lib)
        # CompositeExplicitAutograd: the C++ kernel, registered for CPU, wins when loaded
        lib.impl(OP, fallback, "CompositeExplicitAutograd")
        _library = lib  # the definition lives as long as this object


def _fake(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
          group_size: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], scales_zeros.shape[1]))


def cxx_compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _abi() -> str:
    return f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def _torch_lib() -> Path:
    return Path(torch.__file__).parent / "lib"


def cached_path(cc: str, cxx: str, c_source: Path = C_SOURCE, cxx_source: Path = CXX_SOURCE,
                stem: str = "int4op") -> Path:
    """Where the library of these sources, for these compilers, this torch and this CPU lives."""
    from vllm_edge import envs

    parts = [c_source.read_text(), cxx_source.read_text(), *native.headers_text([c_source]), cc,
             native.compiler_version(cc), cxx,
             native.compiler_version(cxx),
             *FLAGS, _abi(), torch.__version__, platform.machine(), native._cpu_flags()]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return envs.home() / "kernels" / f"{stem}-{key}.so"


def build(cc: str, cxx: str, out: Path, c_source: Path = C_SOURCE, cxx_source: Path = CXX_SOURCE) -> None:
    """``c_source`` compiled as C and linked with ``cxx_source`` against torch into ``out``."""
    from torch.utils.cpp_extension import include_paths

    from vllm_edge.common import atomic

    with tempfile.TemporaryDirectory(prefix="vllm-edge-op-") as tmp_dir, atomic.file_path(out) as tmp:
        obj = Path(tmp_dir) / (c_source.stem + ".o")
        run = functools.partial(subprocess.run, check=True, capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT_S)
        run([cc, *FLAGS, "-fPIC", "-c", str(c_source), "-o", str(obj)])  # as C, not C++
        run([cxx, *FLAGS, "-shared", "-fPIC", "-std=c++20", _abi(),
             *(f"-I{p}" for p in include_paths()), str(cxx_source), str(obj),
             f"-L{_torch_lib()}", "-lc10", "-ltorch_cpu", "-ltorch", "-o", str(tmp)])


def note(msg: str, *args) -> None:
    """A progress note: the log where it is shown (vLLM processes), else stderr."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(msg, *args)
    else:
        print("vllm-edge: " + msg % args, file=sys.stderr, flush=True)


def _probe(path: Path) -> None:
    """The loaded kernel must give ``native.gemv``'s bits on a small random weight (any
    nibbles are a valid packed tensor), with the int8-activation switch set as the ctypes
    kernel's; raises otherwise."""
    lib = native.library()
    if lib is not None:
        op_lib = ctypes.CDLL(str(path))
        native.set_act8(op_lib, bool(lib.edge_int4_act8()))
        native.set_prefetch(op_lib, "edge_int4")
    gen = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (128, 64), dtype=torch.uint8, generator=gen)
    sz = torch.randn(4, 128, 2, generator=gen).to(torch.bfloat16)
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    got = getattr(torch.ops, NAMESPACE).int4_gemv.default(x, packed, sz, 32)
    want = native.gemv(x, packed, sz, 32)
    if want is None or not torch.equal(got, want):
        raise RuntimeError("its output differs from native.gemv on a probe")


def _unavailable() -> str | None:
    """Why the op cannot be used here, before any build; ``None`` if it can be tried."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_INT4_NATIVE_OP"):
        return "off (VLLM_EDGE_INT4_NATIVE_OP=0)"
    if not native.gemv_supported():
        return "not used: the native product does not run here"
    if native._compiler() is None or cxx_compiler() is None:
        return "unavailable: no C and C++ compiler found"
    return None


@functools.cache
def load() -> bool:
    """Build (first use) and load the C++ kernel; whether ``vllm_edge::int4_gemv`` runs it.
    Needs :func:`define` first (``ops.register``). Logged once when it cannot."""
    global _state
    why = _unavailable()
    if why is not None:
        _state = why
        if why.startswith("unavailable"):
            logger.warning("cpu_int4: %s; linears keep the Python op (correct, slower)", why)
        return False
    cc, cxx = native._compiler(), cxx_compiler()
    path = cached_path(cc, cxx)
    err = build_load_probe("cpu_int4: the native op (quant/csrc/int4_op.cpp)", path,
                           lambda: build(cc, cxx, path), lambda: _probe(path), "linears keep the Python op")
    _state = f"failed: {err[-300:]}" if err else f"loaded ({path})"
    return err is None


def build_load_probe(what: str, path: Path, make: Callable[[], None], probe: Callable[[], None],
                     fallback: str) -> str | None:
    """``make`` the library at ``path`` if it is missing (first use, tens of seconds), load it
    and ``probe`` it; None when it runs, else the error, logged once with what ``fallback`` is."""
    try:
        if not path.exists():
            note(BUILDING, what)
            start = time.monotonic()
            make()
            note("%s: built %s in %.0f s", what, path, time.monotonic() - start)
        torch.ops.load_library(str(path))
        probe()
    except (OSError, subprocess.SubprocessError, RuntimeError, EdgeError) as exc:  # EdgeError: cache not writable
        err = (getattr(exc, "stderr", "") or str(exc)).strip()
        logger.warning("%s (%s) cannot be used (%s); %s (correct, slower)", what, path.name, err[-600:],
                       fallback)
        return err
    return None


def state() -> str:
    """What the op amounts to in this process, without building it (for ``doctor``)."""
    if load.cache_info().currsize:
        return _state
    why = _unavailable()
    if why is not None:
        return why
    path = cached_path(native._compiler(), cxx_compiler())
    if path.exists():
        return f"built ({path}); loaded when a cpu_int4 model loads"
    return "not built yet: built when a cpu_int4 model first loads (tens of seconds)"
