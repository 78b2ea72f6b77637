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


def run_refused(*args: str, env: dict | None = None, timeout: float = 600) -> str:
    """Run `vllm-edge run ARGS`, which must refuse them (exit 2, no traceback) before any engine
    starts; returns its stderr."""
    proc = run_cli("run", *args, env=env, timeout=timeout)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert "engine ready" not in proc.stderr and "Initializing" not in proc.stdout + proc.stderr
    return proc.stderr
