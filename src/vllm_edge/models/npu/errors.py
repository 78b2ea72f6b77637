"""The error of the NPU export: what it cannot export, by name."""

from __future__ import annotations

from vllm_edge.common.errors import EdgeError


class NpuExportError(EdgeError):
    """A model, a shape or a destination export-npu refuses; the message says why."""
