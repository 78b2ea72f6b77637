"""The build cache under ``$VLLM_EDGE_HOME/models``: what is there, when each build was last
loaded, and removing one.

A build is a directory vllm-edge wrote with a manifest: an embedded model's conversion or
quantization, a GGUF file's build (``gguf/``), a model folder's build (``hf/``)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_edge import envs
from vllm_edge.common import atomic, manifest
from vllm_edge.common.errors import EdgeError

SUBDIRS = ("gguf", "hf")  # keyed builds of files and folders the user named
USE_DIR = ".last_use"


class CacheError(EdgeError):
    pass


def root() -> Path:
    return envs.home() / "models"


@dataclass
class Build:
    name: str            # path relative to root(), as `models rm` takes it
    path: Path
    kind: str            # converter, e.g. quantize/2 or gguf-repack/1
    scheme: str          # bf16, cpu_int4-g32, gptq-g128, ...
    source: str
    bytes: int
    last_use: float | None
    problem: str | None


def _stamp(path: Path) -> Path:
    return root() / USE_DIR / Path(path).resolve().relative_to(root().resolve()).as_posix().replace("/", "__")


def mark_used(path: str | os.PathLike) -> None:
    """Record that an engine is about to load the build at ``path`` (nothing for a directory
    outside the cache). A stamp file's mtime, so concurrent starts never contend."""
    p = Path(path).expanduser().resolve()
    try:
        stamp = _stamp(p)
    except ValueError:
        return
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    except OSError:
        pass  # a read-only cache still loads


def _scheme(data: dict) -> str:
    qc = data.get("scheme")
    if qc:
        group = data.get("group_size")
        return f"{qc}-g{group}" if group else str(qc)
    return "bf16"


def _describe(path: Path) -> Build:
    data = manifest.read(path)
    files = data.get("files") if isinstance(data.get("files"), dict) else {}
    size = sum(int(f.get("size") or 0) for f in files.values()) if files else \
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    stamp = _stamp(path)
    return Build(name=path.relative_to(root()).as_posix(), path=path,
                 kind=str(data.get("converter") or "?"), scheme=_scheme(data),
                 source=str(data.get("source") or data.get("source_file") or "?"), bytes=size,
                 last_use=stamp.stat().st_mtime if stamp.exists() else None,
                 problem=manifest.problem(path))


def builds() -> list[Build]:
    """Every build in the cache, by name. Temp and lock files of writes in progress are not
    builds."""
    out: list[Build] = []
    base = root()
    if not base.is_dir():
        return out
    dirs = [d for d in base.iterdir() if d.is_dir() and d.name not in SUBDIRS]
    for sub in SUBDIRS:
        if (base / sub).is_dir():
            dirs += [d for d in (base / sub).iterdir() if d.is_dir()]
    for d in sorted(dirs):
        if d.name.startswith(".") or not (d / manifest.NAME).exists():
            continue
        out.append(_describe(d))
    return out


def find(name: str) -> Build:
    """The build ``name`` (as `models list` prints it, or its directory's path)."""
    for b in builds():
        if name in (b.name, str(b.path)) or Path(name).expanduser().resolve() == b.path.resolve():
            return b
    known = ", ".join(b.name for b in builds()) or "none"
    raise CacheError(f"{name}: no such build in {root()}; builds: {known}")


def remove(name: str) -> Build:
    """Remove one build, under its write lock (a writer of the same build waits), by moving
    it aside first so a kill leaves either the whole build or none of it."""
    b = find(name)
    with atomic.lock(b.path):
        # a .partial name: a kill mid-removal leaves litter the next write of this build sweeps
        trash = b.path.parent / f".{b.path.name}.rm-{os.getpid()}.partial"
        os.rename(b.path, trash)
        shutil.rmtree(trash)
    try:
        _stamp(b.path).unlink()
    except OSError:
        pass
    return b


def age(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "never"
    s = max(0.0, (now or time.time()) - ts)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f} {unit} ago"
    return "just now"
