"""The sampling a server applies to a request that does not set its own: the model's values
where it has them, else a truncated-tail default; each with where it came from.

vLLM takes a model's defaults from its ``generation_config.json``, and otherwise samples from
the whole distribution at temperature 1: on a small model a long tail of unlikely tokens, one
of which derails the answer within a sentence. Where the values come from, first found wins:

1. the build's ``generation_config.json``, when it names any sampling value;
2. a GGUF file's ``general.sampling.*`` metadata (what llama.cpp reads);
3. the embedded model's recommended settings (its model card's), kept in ``models/store.py``;
4. :data:`FALLBACK`, a truncated tail as llama.cpp samples by default.

``serve`` hands the values to vLLM (``--override-generation-config``), so every client gets
them, and reports them on ``/vllm-edge/status`` for the chat's ``/show``. A request's own values
win; a request at temperature 0 stays greedy (no penalty is among the defaults).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# generation_config.json's names of what vLLM reads as default sampling values
KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# llama.cpp's metadata names for the same
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
             "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
             "general.sampling.penalty_repeat": "repetition_penalty"}
# A truncated tail: llama.cpp's own defaults for temperature, top-k, top-p and min-p (its
# repeat penalty is off by default, and a penalty would change greedy answers too).
FALLBACK = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
FALLBACK_SOURCE = "vllm-edge's default for a model that names none (a truncated tail, as llama.cpp samples)"


@dataclass(frozen=True)
class Defaults:
    values: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def explain(self) -> str:
        shown = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.values.items())
        return f"sampling defaults: {shown} ({self.source}); a request's own values win"


def _pick(raw: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    out = {}
    for key, name in names.items():
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return {k: out[k] for k in KEYS if k in out}


def from_generation_config(model_dir: Path) -> dict[str, Any]:
    """The sampling values a model folder's generation_config.json names (none: ``{}``)."""
    try:
        raw = json.loads((Path(model_dir) / "generation_config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict) or raw.get("do_sample") is False:
        return {}
    return _pick(raw, {k: k for k in KEYS})


def from_gguf(path: Path) -> dict[str, Any]:
    """The ``general.sampling.*`` values of a GGUF file (none: ``{}``)."""
    from vllm_edge.models.gguf_import import GgufImportError, inspect_gguf

    try:
        meta = inspect_gguf(path).metadata
    except GgufImportError:
        return {}
    return _pick(meta, GGUF_KEYS)


def for_model(model: str, model_dir: Path) -> Defaults:
    """The defaults for the model argument ``model``, served from the build ``model_dir``."""
    from vllm_edge.models import store

    found = from_generation_config(model_dir)
    if found:
        return Defaults(found, "the model's generation_config.json")
    if store.is_gguf(model):
        found = from_gguf(Path(model).expanduser())
        if found:
            return Defaults(found, "the GGUF file's general.sampling metadata")
    if model == "default" or model in store.MODELS:
        embedded = store.resolve_key(model)
        if embedded.sampling:
            return Defaults(dict(embedded.sampling), f"{embedded.card_name}'s recommended settings")
    return Defaults(dict(FALLBACK), FALLBACK_SOURCE)
