"""Reading a model folder's ``config.json`` with clear errors: one that does not parse, is
not an object, or nests deeper than any real config (a hostile one can make Python's
decoder, or whatever walks it next, raise ``RecursionError``) is refused naming the file;
:func:`positive_int` refuses a size field that is zero, negative or not an integer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vllm_edge.common.errors import EdgeError

# A real config nests 4 levels (text_config.rope_scaling...); 64 leaves room for any.
MAX_DEPTH = 64


class ModelConfigError(EdgeError, ValueError):
    """A config.json vllm-edge cannot use, named with the field at fault."""


def depth(value: Any) -> int:
    """Levels of objects and arrays in ``value``, without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def loads(text: str | bytes, where: str) -> dict:
    try:
        cfg = json.loads(text)
    except RecursionError:
        raise ModelConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ModelConfigError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{where}: expected a JSON object")
    if depth(cfg) > MAX_DEPTH:
        raise ModelConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return cfg


def read(path: str | os.PathLike) -> dict:
    """``path`` (a config.json, or a folder holding one) as a dict, or ModelConfigError."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: missing; a model folder must hold a Hugging Face "
                               "config.json") from None
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return loads(text, str(path))


def positive_int(cfg: Any, name: str, default: Any = None, *, where: str = "config.json") -> int:
    """``cfg[name]`` as a positive int (``default`` when absent or null), else an error
    naming the field."""
    value = cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if isinstance(value, float) and value.is_integer() and value > 0:
            return int(value)
        raise ModelConfigError(f"{where}: field {name}={value!r}; expected a positive integer")
    return value
