"""Run the CLI as a user would, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `vllm-edge ARGS` as a user would, in a fresh interpreter."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "vllm_edge.cli", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
