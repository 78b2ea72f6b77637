"""Processes as the engine tests see them."""

from __future__ import annotations

import os


def gone(pid: int) -> bool:
    """No process with this pid is left."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
