"""The llama.cpp build a process loaded, as provenance records it.

llama-cpp-python compiles llama.cpp from source at install time, and the same version number
can stand for very different kernels: which SIMD extensions ggml's CPU backend was compiled
for, whether its AMX kernels are in. A llama.cpp figure is only reproducible with those, so
every artifact of a process that loaded llama.cpp carries them (:func:`describe`).

Three sources, most trusted first: what the loaded library reports
(``llama_print_system_info``: the features ggml was compiled with, since each
``ggml_cpu_has_*`` is a compile-time test), what its files hold (which CPU backend variants
were built, whether the AMX kernels are linked in), and the ``CMAKE_ARGS`` that
``scripts/install.sh`` exported, written to :data:`RECORD` inside the environment. pip keeps
no trace of ``CMAKE_ARGS``, and a wheel from its cache (which does not key on them) may have
been built under others, so the record is void once the library it hashed is replaced, and the
library's own features win where the two disagree.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

# Written by scripts/install.sh beside the environment's interpreter (sys.prefix), and inside the
# library directory of a build of its own (``install.sh --llamacpp-amx``).
RECORD = "llama-cpp-build.json"
CPU_LIBRARY = "libggml-cpu.so"
# A symbol only ggml-cpu's AMX kernels define: present when the build compiled them in.
AMX_SYMBOL = b"ggml_backend_amx"


# install.sh --llamacpp-amx: llama.cpp with its AMX kernels, as libraries in the environment.
AMX_BUILD = "llama-cpp-amx"


def amx_build_dir(prefix: Path | None = None) -> Path | None:
    """The AMX build's library directory, for ``LLAMA_CPP_LIB_PATH``; None when it was not built
    or this CPU cannot run it (an environment carried to a CPU without AMX)."""
    from vllm_edge.common import hw

    lib = (Path(sys.prefix) if prefix is None else Path(prefix)) / AMX_BUILD
    if not (lib / "libllama.so").is_file() or not amx_kernels(lib / CPU_LIBRARY):
        return None
    isa = hw.probe_cpu().isa
    return lib if isa.get("amx_tile") and isa.get("amx_int8") else None


def amx_kernels(cpu_library: Path) -> bool | None:
    """Whether a ggml CPU library has the AMX kernels compiled in; None when it is absent."""
    return (AMX_SYMBOL in cpu_library.read_bytes()) if cpu_library.is_file() else None


def parse_system_info(text: str) -> dict[str, dict[str, Any]]:
    """``llama_print_system_info``'s string as {backend: {feature: value}}, a value an int when
    it is one (``"CPU : AVX2 = 1 | SVE_CNT = 16 | "`` -> ``{"CPU": {"AVX2": 1, "SVE_CNT": 16}}``).

    Each backend opens with ``NAME : ``; builds older than backend registration print bare
    ``FEATURE = value`` pairs, which are the CPU's."""
    out: dict[str, dict[str, Any]] = {}
    backend = "CPU"
    for part in text.split("|"):
        part = part.strip()
        if " : " in part:
            backend, _, part = (p.strip() for p in part.partition(" : "))
        name, eq, value = (p.strip() for p in part.partition("="))
        if not name or not eq:
            continue
        out.setdefault(backend, {})[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _ggml_string(lib_dir: Path, fn: str) -> str | None:
    """``ggml_version``/``ggml_commit`` of the ggml the package ships (absent in older builds)."""
    try:
        f = getattr(ctypes.CDLL(str(lib_dir / "libggml-base.so")), fn)
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_char_p
    return (f() or b"").decode(errors="replace") or None


def loaded_lib_dir(llama_cpp) -> Path:
    """The directory of the libllama the module loaded: the package's own ``lib/``, or the one
    ``LLAMA_CPP_LIB_PATH`` pointed it at (another build of the same llama.cpp). Its ggml
    libraries sit beside it, and the description must be of those, not of the package's."""
    name = getattr(getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None), "_name", None)
    return Path(name).parent if name else Path(llama_cpp.__file__).parent / "lib"


def read_record(prefix: Path, cpu_library: Path | None) -> dict[str, Any]:
    """The ``CMAKE_ARGS`` of :data:`RECORD` under ``prefix``: ``cmake_args`` None with a reason in
    ``cmake_args_source`` when there is no record or it hashed another library."""
    path = prefix / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"cmake_args": None, "cmake_args_source": "not recorded (no install record)"}
    lib_sha = _sha256(cpu_library) if cpu_library and cpu_library.is_file() else None
    if not lib_sha or record.get(CPU_LIBRARY + "_sha256") != lib_sha:
        return {"cmake_args": None,
                "cmake_args_source": f"not recorded ({RECORD} describes another build of {CPU_LIBRARY})"}
    return {"cmake_args": record.get("cmake_args") or "", "cmake_args_source": RECORD}


def describe(llama_cpp=None, prefix: Path | None = None) -> dict[str, Any]:
    """The build of ``llama_cpp`` (the loaded module; imported when not given)."""
    from importlib import metadata

    if llama_cpp is None:
        import llama_cpp
    try:
        package = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        package = getattr(llama_cpp, "__version__", None)
    info = llama_cpp.llama_print_system_info()
    info = (info.decode(errors="replace") if isinstance(info, bytes) else str(info)).strip()
    lib_dir = loaded_lib_dir(llama_cpp)
    cpu_libraries = sorted(p.name for p in lib_dir.glob("libggml-cpu*.so"))
    cpu_library = lib_dir / CPU_LIBRARY
    version = getattr(llama_cpp, "llama_version", None)
    out: dict[str, Any] = {
        "llama_cpp_python": package,
        "llama_cpp": version().decode(errors="replace") if callable(version) else None,
        "ggml": _ggml_string(lib_dir, "ggml_version"),
        "ggml_commit": _ggml_string(lib_dir, "ggml_commit"),
        "system_info": info,
        "features": parse_system_info(info),
        # one library is a native build; several are GGML_CPU_ALL_VARIANTS, picked at load
        "cpu_backends": cpu_libraries,
        "amx_kernels": amx_kernels(cpu_library),
    }
    # a build of its own (install.sh --llamacpp-amx) keeps its record beside its libraries
    own = lib_dir if (lib_dir / RECORD).is_file() else None
    out.update(read_record(own or (Path(sys.prefix) if prefix is None else prefix),
                           cpu_library if cpu_library.is_file() else None))
    return out
