"""Functions a spawned build child runs in tests/models/test_child.py (importable by name)."""

from __future__ import annotations

import os
import sys

from vllm_edge.common.errors import EdgeError


def pid_and_progress(message: str) -> int:
    """Writes to the inherited stderr (where progress bars go) and returns its pid."""
    print(message, file=sys.stderr, flush=True)
    return os.getpid()


def refuse(why: str) -> None:
    raise EdgeError(why)


def crash() -> None:
    raise KeyError("a bug, not a user error")


def die(code: int) -> None:
    os._exit(code)
