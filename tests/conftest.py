"""Shared fixtures. Engine tests are marked slow and share one prepared model."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded default model, converted once (cached under VLLM_EDGE_HOME)."""
    from vllm_edge.models import default

    return default.prepare("default", progress=False)
