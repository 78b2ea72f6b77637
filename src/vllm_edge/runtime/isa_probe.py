"""Inductor's vector-ISA probe, remembered across starts.

Every process that runs a compiled graph asks Inductor which vector ISAs (AMX, AVX512-VNNI,
AVX512, AVX2 ...) it may use. Inductor answers by dry-compiling a test program per ISA the
CPU advertises and ``dlopen``-ing each result in a fresh subprocess, once per process: about
a second of every warm start here (``vector ISA probe`` in benchmarks/results/startup/).

The answer only changes with the CPU, torch and the compiler. So the first process probes as
Inductor does and records the outcome under ``$VLLM_EDGE_HOME/isa_probe/``, keyed by those
three; when every advertised ISA passed, that process and every later one set Inductor's own
switch for that answer (``config.cpp.vec_isa_ok = True``: use the advertised ISAs without
re-testing them), which yields the same list. The switch is part of Inductor's compile-cache
key, so a cache compiled without it is compiled once more. A record with any failure changes
nothing, and neither does a ``TORCHINDUCTOR_VEC_ISA_OK`` the user set.

That switch covers only the base probe. On top of it Inductor checks AVX512-BF16, AVX512-VNNI,
AMX and AMX-FP16 the same way, each with a compile and a ``dlopen`` subprocess, whatever the
switch says: most of a second of a warm start on a CPU that has them. Each of those checks
that passes is kept in the same record (its ISA class, compiler flags and test program), and
a later process answers it from there. A check that failed is never kept: it may have been
a timeout under load, and it is simply run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

PROBE_VERSION = 1


def _key() -> tuple[str, dict[str, Any]]:
    import torch
    from torch._inductor import cpu_vec_isa

    from vllm_edge import envs

    cxx = shutil.which(envs.get("CXX") or "g++") or shutil.which("c++") or ""
    try:
        cxx_stat = os.stat(os.path.realpath(cxx)) if cxx else None
    except OSError:
        cxx_stat = None
    what = {"version": PROBE_VERSION, "torch": torch.__version__, "machine": platform.machine(),
            "cpu_isa": sorted(cpu_vec_isa.x86_isa_checker()),
            "compiler": [os.path.realpath(cxx) if cxx else None,
                         cxx_stat.st_size if cxx_stat else None, cxx_stat.st_mtime_ns if cxx_stat else None]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16], what


def record_path(key: str) -> Path:
    from vllm_edge import envs

    return envs.home() / "isa_probe" / f"{key}.json"


def _advertised() -> list[str]:
    """The ISAs Inductor would test on this x86 CPU: its own filter on the CPU's flags, without
    the test."""
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    return [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
            if all(f in flags for f in str(isa).split())]


def apply() -> str:
    """Use a remembered probe, or probe now and remember it. Returns what happened:
    ``remembered``, ``recorded``, ``failed-isa`` (probed, some ISA failed: nothing changes),
    ``unrecorded`` (the home is not writable), ``user-set``, ``off`` or ``not-x86``."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_ISA_PROBE_CACHE"):
        return "off"
    if envs.get("TORCHINDUCTOR_VEC_ISA_OK") is not None:
        return "user-set"
    if platform.machine() not in ("x86_64", "AMD64"):
        return "not-x86"
    from torch._inductor import config, cpu_vec_isa

    key, what = _key()
    path = record_path(key)
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        rec = None
    if isinstance(rec, dict) and rec.get("all_passed") and rec.get("what") == what:
        config.cpp.vec_isa_ok = True
        _remember_checks(path, rec)
        return "remembered"
    # the extra checks of the probe below are kept too, once the record says all passed
    rec = {"what": what}
    _remember_checks(path, rec)
    advertised = _advertised()
    passed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]  # Inductor's own probe
    ok = bool(advertised) and sorted(passed) == sorted(advertised)
    rec.update(advertised=advertised, passed=passed, all_passed=ok)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, rec)
    except OSError:
        return "unrecorded"  # a read-only home probes every start, as Inductor does
    if ok:
        # the switch is part of Inductor's compile-cache key: set it in the recording process
        # too, so this start and the next ones share one compiled artifact
        config.cpp.vec_isa_ok = True
    return "recorded" if ok else "failed-isa"


def check_key(isa: Any, code: str) -> str:
    """One of Inductor's ISA checks: the ISA's class, the flags it builds with now (its BF16
    and AMX-FP16 checks add a flag for their build) and the test program."""
    text = f"{type(isa).__name__}\n{isa.build_arch_flags()}\n{code}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# this process's passed checks, by check_key
_passed: dict[str, bool] = {}


def _remember_checks(path: Path, rec: dict[str, Any]) -> None:
    """Answer Inductor's ISA checks from ``rec`` where it holds a pass, and, once ``rec`` says
    every advertised ISA passed, add each new pass to the record at ``path``."""
    from torch._inductor import cpu_vec_isa

    _passed.update({k: True for k, v in (rec.get("checks") or {}).items() if v is True})
    original = cpu_vec_isa.VecISA.check_build
    if getattr(original, "_vllm_edge_isa_memo", False):
        return

    def check_build(self: Any, code: str) -> bool:
        key = check_key(self, code)
        if _passed.get(key):
            return True
        ok = original(self, code)
        if ok:
            _passed[key] = True
            if rec.get("all_passed"):
                try:
                    _write(path, rec)
                except OSError:
                    pass  # unrecorded: the next process runs the check again, as Inductor does
        return ok

    check_build._vllm_edge_isa_memo = True  # type: ignore[attr-defined]
    cpu_vec_isa.VecISA.check_build = check_build  # type: ignore[method-assign]


def _write(path: Path, rec: dict[str, Any]) -> None:
    """The record, with this process's passed checks once every advertised ISA passed."""
    from vllm_edge.common import atomic

    checks = {"checks": dict(sorted(_passed.items()))} if rec.get("all_passed") else {}
    atomic.write_json(path, {**rec, **checks})
