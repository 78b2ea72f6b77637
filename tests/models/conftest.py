"""Fixtures shared by the model tests and their engine modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def exported_bf16(default_model_dir, tmp_path_factory):
    """The default model exported to a bf16 GGUF, once."""
    from vllm_edge.models.gguf_export import export_gguf

    out = tmp_path_factory.mktemp("export") / "smol.bf16.gguf"
    return export_gguf(default_model_dir, out, progress=False)
