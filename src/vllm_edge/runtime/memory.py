"""Return freed heap memory to the OS.

Repacking and compiling during load leave freed blocks in the allocator's
arenas; RssAnon keeps counting them until the allocator is asked to give them
back. glibc does that with ``malloc_trim(0)``; tcmalloc, when it is the
allocator (LD_PRELOAD), with ``MallocExtension_ReleaseFreeMemory``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from dataclasses import asdict, dataclass

from vllm_edge.common.procmem import rss_anon_kb

logger = logging.getLogger("vllm_edge.runtime.memory")


@dataclass
class Release:
    tag: str
    pid: int
    allocator: str
    before_mb: float
    after_mb: float
    trimmed: bool

    @property
    def released_mb(self) -> float:
        return self.before_mb - self.after_mb

    def to_dict(self) -> dict:
        d = asdict(self)
        d["released_mb"] = round(self.released_mb, 1)
        return d


# Releases done in this process, newest last; workers report them over collective_rpc.
history: list[Release] = []


def _loaded_tcmalloc() -> str | None:
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            for line in f:
                if "libtcmalloc" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def trim() -> tuple[str, bool]:
    """Ask the allocator(s) to return freed memory, quietly: (allocator, whether a call ran)."""
    allocator, trimmed = "glibc", False
    tc = _loaded_tcmalloc()
    if tc:
        allocator = "tcmalloc"
        try:
            ctypes.CDLL(tc).MallocExtension_ReleaseFreeMemory()
            trimmed = True
        except (OSError, AttributeError):
            pass
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        try:
            # Still worth calling under tcmalloc: glibc owns whatever was allocated before it.
            trimmed = bool(ctypes.CDLL(libc_name).malloc_trim(0)) or trimmed
        except (OSError, AttributeError):
            allocator = allocator if tc else "unknown (no malloc_trim)"
    return allocator, trimmed


def release_arenas(tag: str) -> Release:
    before = (rss_anon_kb(os.getpid()) or 0) / 1024
    allocator, trimmed = trim()
    after = (rss_anon_kb(os.getpid()) or 0) / 1024
    rel = Release(tag, os.getpid(), allocator, round(before, 1), round(after, 1), trimmed)
    history.append(rel)
    logger.info("released allocator arenas after %s (%s): RssAnon %.0f MB -> %.0f MB (-%.0f MB)",
                tag, allocator, before, after, rel.released_mb)
    return rel
