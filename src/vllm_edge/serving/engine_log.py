"""The engine's output in a log file, so the terminal shows the conversation.

vLLM, torch and transformers write to the process's stdout and stderr from Python
loggers, ``warnings``, C++ and tqdm alike, so the redirect is made at the file-descriptor
level: everything written to fds 1 and 2 while the engine loads and answers goes to
``$VLLM_EDGE_HOME/logs/run-<time>-<pid>.log``. The terminal keeps its own descriptor for
what the user must see. The newest :data:`KEEP` logs are kept.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

KEEP = 20


def new_path(kind: str = "run") -> Path:
    from vllm_edge import envs

    logs = envs.home() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    old = sorted(logs.glob(f"{kind}-*.log"), key=lambda p: p.stat().st_mtime)
    for p in old[:max(0, len(old) - KEEP + 1)]:
        p.unlink(missing_ok=True)
    return logs / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextmanager
def redirected(path: Path) -> Iterator[TextIO]:
    """fds 1 and 2 go to ``path`` inside the block; the yielded stream is the terminal's
    stderr, for status lines. On an exception the log's path is named on the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    term = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    try:
        yield term
    except BaseException:
        term.write(f"[vllm-edge] the engine's log: {path}\n")
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in saved:
            os.close(f)
        term.close()
