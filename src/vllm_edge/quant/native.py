"""The native int4 kernels: ``csrc/int4_gemv.c`` (the product for batches up to the
dequantization threshold) and ``csrc/int4_dequant.c`` (the dequantizer for larger ones).

The product (:func:`gemv`) reads the packed tinygemm tensor with AVX512-BF16 dot products,
faster than tinygemm at one row (figures: benchmarks/results/cpu_int4_microbench_product_g*.json;
why: docs/design/cpu-int4.md). Where torch packs 32-row blocks (a CPU without AVX-512) it runs
``csrc/int4_gemv32.c`` instead, an AVX2/FMA product for batches up to the dequantization
threshold, built into its own library (the dequantizer reads 64-row blocks only). Without
either, tinygemm runs.

The torch-op formulation (``pack.dequantize_packed_t``) costs as much CPU time as the
512-row bf16 GEMM it feeds (addcmul with int8 -> bf16 promotion, strided outputs). The C
kernel reads the packed tinygemm tensor once and writes row-major bf16 through a 16-entry
lookup table per row and group (docs/design/cpu-int4.md). It is bit-identical to :func:`pack.dequantize_packed`.

Both are plain C without torch headers, built into one library with the system C compiler
on first use and cached under ``$VLLM_EDGE_HOME/kernels``, keyed by the source, the
compiler, the flags and the CPU's ISA flags (``-march=native`` code must not run on
another CPU sharing the cache). No compiler, or a failed build, means the torch-op route,
logged once: slower, never wrong.

Threads. By default the rows are split over ``torch.get_num_threads()`` Python threads
(ctypes releases the GIL). Those run while torch's OpenMP workers may still be
spin-waiting after the previous GEMM, so at two threads on two cores they can compete with
them. ``VLLM_EDGE_INT4_OPENMP=1`` instead splits the rows over an OpenMP team in the C
(built with ``-fopenmp``, the first flag set): its ``libgomp.so.1`` resolves to the copy
torch already loaded, so that team is the one torch's own GEMMs run on. Which is faster
end to end is not measured yet (contended hosts only so far); the default stays the route
measured before.

The embedding lookup (:func:`gather_rows`) reads only the requested rows, in the same
fp32 arithmetic, and is bit-identical to :func:`pack.gather_rows_packed`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import platform
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.autograd import profiler as _profiler

from vllm_edge.common.errors import EdgeError

logger = logging.getLogger("vllm_edge.quant")
SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("int4_dequant.c", "int4_gemv.c"))
SOURCES32 = (Path(__file__).with_name("csrc") / "int4_gemv32.c",)
BLOCK_N = 64
_FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3", "-march=native"], ["-O3"])

_NO_RANGE = contextlib.nullcontext()

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _range(name: str) -> contextlib.AbstractContextManager:
    """A profiler range named ``name`` (what `bench profile` shows), opened only while a
    profiler runs: ``record_function`` dispatches profiler ops even when none does."""
    return torch.profiler.record_function(name) if _profiler._is_profiler_enabled else _NO_RANGE


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def compiler_version(cc: str) -> str:
    """The first line of ``cc --version`` ("" when it cannot be read): part of every kernel cache key."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0] if out else ""


def _build(cc: str, flags: list[str], sources: tuple[Path, ...], out: Path) -> None:
    from vllm_edge.common import atomic

    with atomic.file_path(out) as tmp:
        subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", str(tmp), *map(str, sources)],
                       check=True, capture_output=True, text=True, timeout=120)


def headers_text(sources: tuple[Path, ...] | list[Path]) -> list[str]:
    """The headers beside ``sources`` (csrc/*.h), which they may include: part of every cache key."""
    return [h.read_text() for h in sorted({h for src in sources for h in src.parent.glob("*.h")})]


def build_and_load(stem: str, sources: tuple[Path, ...],
                   flag_sets: tuple[list[str], ...] | list[list[str]] = _FLAG_SETS
                   ) -> tuple[ctypes.CDLL | None, list[str]]:
    """``sources`` built into one shared library under ``$VLLM_EDGE_HOME/kernels`` (the first
    flag set that compiles) and loaded; ``(None, errors)`` when none does or there is no C
    compiler. The cache key holds the sources, the compiler, the flags and the CPU's ISA
    flags: ``-march=native`` code must not run on another CPU sharing the cache."""
    from vllm_edge import envs

    cc = _compiler()
    if cc is None:
        return None, ["no C compiler found"]
    version = [v] if (v := compiler_version(cc)) else []
    errors = []
    for flags in flag_sets:
        key = hashlib.sha256("\n".join([*(src.read_text() for src in sources), *headers_text(sources), cc,
                                        *version, *flags, platform.machine(), _cpu_flags()]).encode()).hexdigest()[:16]
        path = envs.home() / "kernels" / f"{stem}-{key}.so"
        try:
            if not path.exists():
                _build(cc, flags, sources, path)
            return ctypes.CDLL(str(path)), errors
        except (OSError, subprocess.SubprocessError, EdgeError) as exc:  # EdgeError: cache not writable
            err = getattr(exc, "stderr", "") or str(exc)
            errors.append(f"{' '.join(flags)}: {err.strip()[-300:]}")
    return None, errors


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first use; ``None`` (logged once) if it cannot be."""
    if _compiler() is None:
        logger.warning("cpu_int4: no C compiler found; multi-row batches dequantize with torch "
                       "ops (correct, slower dequantization)")
        return None
    from vllm_edge.quant import pack

    if pack.block_n() != BLOCK_N:
        # the kernels read blocks of 64 rows, the AVX-512 packing; torch packs narrower ones
        # on a CPU without AVX-512, so they would read the wrong rows
        logger.warning("cpu_int4: torch packs int4 weights in blocks of %d rows on this CPU; "
                       "multi-row batches dequantize with torch ops (correct, slower)", pack.block_n())
        return None
    lib, errors = build_and_load("int4", SOURCES)
    if lib is not None:
        signatures = {"edge_int4_dequant_blocks": (3, 5), "edge_int4_dequant_tail": (3, 3),
                      "edge_int4_dequant_team": (3, 7), "edge_int4_gather_rows": (4, 4)}
        for name, (pointers, ints) in signatures.items():
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * ints
        lib.edge_int4_gemv.restype = ctypes.c_int
        lib.edge_int4_gemv.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5
        for name in ("edge_int4_openmp", "edge_int4_gemv_supported"):
            getattr(lib, name).restype = ctypes.c_int
            getattr(lib, name).argtypes = []
        set_act8(lib)
        set_prefetch(lib, "edge_int4")
        return lib
    logger.warning("cpu_int4: building %s failed (%s); small batches run on tinygemm and "
                   "multi-row batches dequantize with torch ops (correct, slower)",
                   " and ".join(src.name for src in SOURCES), " | ".join(errors))
    return None


def set_act8(lib: ctypes.CDLL, on: bool | None = None) -> bool:
    """Set whether ``lib`` (the ctypes kernel, or the C++ op's library that holds its own copy
    of the product) rounds activations to int8: ``on``, else ``VLLM_EDGE_INT4_ACT8``. Returns
    whether it now does (False where the product was not built with AVX512-VNNI)."""
    from vllm_edge import envs

    return act8_switch(lib, "edge_int4", envs.get("VLLM_EDGE_INT4_ACT8") if on is None else on)


def set_prefetch(lib: ctypes.CDLL, prefix: str, ahead: int | None = None) -> int:
    """Set how many groups ahead a kernel library's decode product prefetches the scales
    (``<prefix>_set_prefetch``): ``ahead``, else ``VLLM_EDGE_SCALE_PREFETCH``. Returns it."""
    from vllm_edge import envs

    ahead = int(envs.get("VLLM_EDGE_SCALE_PREFETCH") if ahead is None else ahead)
    setter = getattr(lib, f"{prefix}_set_prefetch")
    setter.restype, setter.argtypes = None, [ctypes.c_int]
    setter(ahead)
    return ahead


def act8_switch(lib: ctypes.CDLL, prefix: str, want: bool) -> bool:
    """Set a kernel library's int8-activation switch (``<prefix>_set_act8``) and read back
    whether its product now takes int8 activations (``<prefix>_act8``)."""
    setter, getter = getattr(lib, f"{prefix}_set_act8"), getattr(lib, f"{prefix}_act8")
    setter.restype, setter.argtypes = None, [ctypes.c_int]
    getter.restype, getter.argtypes = ctypes.c_int, []
    setter(int(bool(want)))
    return bool(getter())


@functools.cache
def openmp() -> bool:
    """Whether the loaded kernel was built with OpenMP."""
    lib = library()
    return bool(lib is not None and lib.edge_int4_openmp())


@functools.cache
def gemv_supported() -> bool:
    """Whether :func:`gemv` can run here: ``VLLM_EDGE_INT4_GEMV`` on, AVX512-BF16 and VBMI code, and
    an OpenMP build (a one-thread build would lose to tinygemm's threads). Logged once when
    it cannot."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_INT4_GEMV"):
        logger.info("cpu_int4: VLLM_EDGE_INT4_GEMV=0; small batches run on tinygemm")
        return False
    lib = library()
    ok = bool(lib is not None and lib.edge_int4_gemv_supported() and lib.edge_int4_openmp())
    if lib is not None and not ok:
        logger.warning("cpu_int4: the native int4 product needs AVX512-BF16, VBMI and an OpenMP build; "
                       "small batches run on tinygemm (correct, slower decode)")
    return ok


@functools.cache
def library32() -> ctypes.CDLL | None:
    """The AVX2/FMA product for torch's 32-row blocks (``csrc/int4_gemv32.c``), built on first
    use; ``None`` where torch packs other blocks or it cannot be built (logged once)."""
    from vllm_edge.quant import pack

    if pack.block_n() != 32 or _compiler() is None:
        return None
    lib, errors = build_and_load("int4_gemv32", SOURCES32)
    if lib is None:
        logger.warning("cpu_int4: building int4_gemv32.c failed (%s); small batches run on tinygemm "
                       "(correct, slower decode)", " | ".join(errors))
        return None
    lib.edge_int4_gemv32.restype = ctypes.c_int
    lib.edge_int4_gemv32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5
    for name in ("edge_int4_gemv32_supported", "edge_int4_gemv32_openmp"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = []
    set_prefetch(lib, "edge_int4_gemv32")
    return lib


@functools.cache
def gemv32_supported() -> bool:
    """Whether :func:`gemv` runs the 32-row-block product here: ``VLLM_EDGE_INT4_GEMV`` on,
    torch's packing in 32-row blocks, and an AVX2/FMA OpenMP build. Logged once when the
    packing is that one but the build is not."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_INT4_GEMV"):
        return False
    lib = library32()
    ok = bool(lib is not None and lib.edge_int4_gemv32_supported() and lib.edge_int4_gemv32_openmp())
    if lib is not None and not ok:
        logger.warning("cpu_int4: the 32-row int4 product needs AVX2, FMA and an OpenMP build; "
                       "small batches run on tinygemm (correct, slower decode)")
    return ok


def gemv(x2: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, kgroup: int,
         max_rows: int | None = None) -> torch.Tensor | None:
    """``x2 @ W^T`` for bf16 ``x2`` [M, K] straight from the tinygemm-layout weight, on
    torch's OpenMP team; ``None`` when no product can take it. The AVX512-BF16 product takes
    any M (N a multiple of 64, K of 32); the AVX2 one for 32-row blocks takes M up to
    ``max_rows`` (None: any), N a multiple of 32 and an even group. Tensors must be
    contiguous and ``sz`` bf16."""
    if x2.dtype != torch.bfloat16 or sz.dtype != torch.bfloat16:
        return None
    if not (packed.is_contiguous() and sz.is_contiguous()):
        return None
    m, k = x2.shape
    n = packed.shape[0]
    if sz.shape[0] * kgroup != k:
        return None
    if gemv_supported():
        fn = library().edge_int4_gemv
    elif (max_rows is None or m <= max_rows) and gemv32_supported():
        fn = library32().edge_int4_gemv32
    else:
        return None
    x2 = x2.contiguous()
    y = torch.empty(m, n, dtype=torch.bfloat16)
    with _range("edge_int4_product"):
        rc = fn(packed.data_ptr(), sz.data_ptr(), x2.data_ptr(), y.data_ptr(), m, n, k, kgroup,
                torch.get_num_threads())
    return y if rc == 0 else None


@functools.cache
def team_route() -> bool:
    """``VLLM_EDGE_INT4_OPENMP=1`` and an OpenMP build: dequantize on torch's OpenMP team."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_INT4_OPENMP"):
        return False
    if not openmp():
        logger.warning("cpu_int4: VLLM_EDGE_INT4_OPENMP=1 but the native kernel was built "
                       "without OpenMP; dequantizing with Python threads")
        return False
    return True


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="edge-int4-deq")
            _pool_size = threads
        return _pool


def dequantize(packed: torch.Tensor, sz: torch.Tensor, kgroup: int, r0: int = 0,
               r1: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """Rows ``[r0, r1)`` of the tinygemm-layout weight as row-major bf16 ``[r1 - r0, K]``
    (into ``out`` if given), or ``None`` when the kernel is unavailable or the tensors
    are not in the expected form.

    ``sz`` is tinygemm's bf16 ``[K/kgroup, N, 2]``. ``r0`` must be a multiple of 64, and
    ``r1`` too unless it is N (the tail block).
    """
    lib = library()
    if lib is None:
        return None
    n = packed.shape[0]
    k = sz.shape[0] * kgroup
    r1 = n if r1 is None else r1
    if (sz.dtype != torch.bfloat16 or k % 32 or not packed.is_contiguous() or not sz.is_contiguous()
            or r0 % BLOCK_N or (r1 % BLOCK_N and r1 != n) or not 0 <= r0 < r1 <= n):
        return None
    w = out[:r1 - r0] if out is not None else torch.empty(r1 - r0, k, dtype=torch.bfloat16)
    p, s, o = packed.data_ptr(), sz.data_ptr(), w.data_ptr()
    row_bytes = k * w.element_size()
    b0, b1 = r0 // BLOCK_N, r1 // BLOCK_N
    tail = r1 == n and n % BLOCK_N
    team = torch.get_num_threads()
    if team > 1 and team_route():
        lib.edge_int4_dequant_team(p, s, o, n, k, kgroup, b0, b1, int(bool(tail)), team)
        return w
    threads = max(1, min(team, b1 - b0))
    if b1 > b0:
        if threads == 1:
            lib.edge_int4_dequant_blocks(p, s, o, n, k, kgroup, b0, b1)
        else:
            bounds = [b0 + (b1 - b0) * i // threads for i in range(threads + 1)]
            jobs = [_executor(threads).submit(lib.edge_int4_dequant_blocks, p, s,
                                              o + (lo - b0) * BLOCK_N * row_bytes, n, k, kgroup, lo, hi)
                    for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
            for j in jobs:
                j.result()
    if tail:
        lib.edge_int4_dequant_tail(p, s, o + (b1 * BLOCK_N - r0) * row_bytes, n, k, kgroup)
    return w


# One reusable bf16 buffer per process. A fresh [N, K] tensor per call is mmap'd above
# glibc's 32 MB mmap ceiling and page-faulted in on every call: measured 20 ms instead
# of 7 ms for a 4096x4096 dequantization.
_ws_lock = threading.Lock()
_workspace: torch.Tensor | None = None


def _workspace_rows(n: int, k: int, cap_bytes: int) -> int:
    rows = max(BLOCK_N, cap_bytes // (2 * k) // BLOCK_N * BLOCK_N)
    return n if rows >= n else rows


def linear(x2: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, kgroup: int,
           workspace_bytes: int) -> torch.Tensor | None:
    """``x2 @ W^T`` for bf16 ``x2`` [M, K]: dequantize into the workspace (at most
    ``workspace_bytes``, grown on demand and kept), then a bf16 GEMM; layers larger than the
    workspace run in chunks of output rows. ``None`` when the native kernel cannot run."""
    global _workspace
    if library() is None or x2.dtype != torch.bfloat16:
        return None
    n = packed.shape[0]
    k = sz.shape[0] * kgroup
    rows = _workspace_rows(n, k, workspace_bytes)
    with _ws_lock:
        if _workspace is None or _workspace.numel() < rows * k:
            _workspace = None  # free the old one before allocating the larger one
            _workspace = torch.empty(rows * k, dtype=torch.bfloat16)
        ws = _workspace[:rows * k].view(rows, k)
        if rows == n:
            with _range("edge_int4_dequant"):
                w = dequantize(packed, sz, kgroup, out=ws)
            return None if w is None else torch.nn.functional.linear(x2, w)
        out = torch.empty(x2.shape[0], n, dtype=x2.dtype)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            with _range("edge_int4_dequant"):
                w = dequantize(packed, sz, kgroup, r0, r1, out=ws)
            if w is None:
                return None
            out[:, r0:r1] = torch.nn.functional.linear(x2, w)
        return out


def workspace_bytes() -> int:
    """Bytes the process-wide dequantization workspace holds now (0 before first use)."""
    ws = _workspace
    return 0 if ws is None else ws.numel() * ws.element_size()


def checked_ids(ids: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """``ids`` flattened to contiguous int64, each checked to be a row of ``what``'s ``n``-row
    table (``IndexError`` naming the first id outside it): every embedding lookup's check."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel():
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"{what}: token id {lo if lo < 0 else hi} is outside the table of {n} rows")
    return flat


def gather_rows(packed: torch.Tensor, sz: torch.Tensor, kgroup: int,
                ids: torch.Tensor) -> torch.Tensor | None:
    """Rows ``ids`` of the tinygemm-layout weight as bf16 ``[len(ids), K]`` (an embedding
    lookup), or ``None`` when the kernel is unavailable or the tensors are not in the
    expected form. An id outside the table raises ``IndexError``."""
    lib = library()
    if lib is None or sz.dtype != torch.bfloat16 or not packed.is_contiguous() or not sz.is_contiguous():
        return None
    n = packed.shape[0]
    k = sz.shape[0] * kgroup
    flat = checked_ids(ids, n, "cpu_int4 embedding")
    out = torch.empty(flat.numel(), k, dtype=torch.bfloat16)
    lib.edge_int4_gather_rows(packed.data_ptr(), sz.data_ptr(), flat.data_ptr(), out.data_ptr(),
                              n, k, kgroup, flat.numel())
    return out
