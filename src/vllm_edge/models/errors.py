"""The error every model source raises when it cannot give the build an engine loads."""

from __future__ import annotations

from vllm_edge.common.errors import EdgeError


class ModelNotAvailable(EdgeError):
    """A model argument that names nothing usable, or a build that could not be made."""
