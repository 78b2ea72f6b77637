"""The manifest every vllm-edge build carries: ``vllm_edge_manifest.json`` in the build's
directory, naming its source, the converter that made it and its options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NAME = "vllm_edge_manifest.json"


def read(directory: str | Path) -> dict[str, Any]:
    """The manifest of ``directory``; ``{}`` when there is none or it does not parse."""
    try:
        data = json.loads((Path(directory) / NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(directory: str | Path, data: dict[str, Any]) -> Path:
    path = Path(directory) / NAME
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
