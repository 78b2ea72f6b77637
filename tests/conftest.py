"""Shared fixtures. Engine tests are marked slow and share one prepared model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `vllm-edge ARGS` as a user would, in a fresh interpreter."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "vllm_edge.cli", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded default model, converted once (cached under VLLM_EDGE_HOME)."""
    from vllm_edge.models import default

    return default.prepare("default", progress=False)
