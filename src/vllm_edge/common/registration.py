"""A use of a real vLLM extension point (not a patch), as the plugin reports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Registration:
    name: str
    kind: str  # e.g. "quantization_config", "ir_impl", "custom_op"
    target: str
    state: str  # "registered" | "skipped: <why>"
