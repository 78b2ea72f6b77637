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


def problem(directory: str | Path) -> str | None:
    """Why the build in ``directory`` cannot be used as it is, or None when its manifest
    and every file the manifest lists (size, and sha256 where recorded) are in place."""
    import hashlib

    directory = Path(directory)
    data = read(directory)
    if not data:
        return f"{directory}: no {NAME}"
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        return f"{directory}: its manifest lists no files (made by an older vllm-edge)"
    for name, want in files.items():
        p = directory / name
        if not p.is_file():
            return f"{directory}: {name} is missing"
        size = p.stat().st_size
        if size != want.get("size"):
            return f"{directory}: {name} has {size} bytes, the manifest says {want.get('size')}"
        if "sha256" in want and hashlib.sha256(p.read_bytes()).hexdigest() != want["sha256"]:
            return f"{directory}: {name} changed since it was written"
    return None


def mismatch(directory: str | Path, want: dict[str, Any], ignore: tuple[str, ...] = ("source",)) -> str | None:
    """Why the build in ``directory`` is not the one ``want`` describes (or is broken),
    or None when it is complete and its manifest agrees with ``want`` on every key but
    ``ignore``."""
    broken = problem(directory)
    if broken:
        return broken
    have = read(directory)
    for key, value in want.items():
        if key not in ignore and have.get(key) != value:
            return f"{directory}: built with {key}={have.get(key)!r}, wanted {value!r}"
    return None
