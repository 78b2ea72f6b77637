"""A loaded tokenizer drops the lists it was built from (docs/design/patches.md).

transformers 5's BPE tokenizer classes (Gemma, Qwen2, Llama and others) take the vocabulary and
the merges as Python lists, build the Rust tokenizer from them in ``__init__`` and keep both lists
as ``_vocab`` and ``_merges``. Nothing reads them afterwards: the Rust tokenizer holds the truth.
vLLM 0.32.0 keeps the tokenizer for the life of the process and copies it into the renderer and
its thread pool, so a 262k-entry vocabulary keeps about 200 MB of strings resident that no call
ever touches. The patch drops the two lists from the tokenizer ``get_cached_tokenizer`` wraps
(every tokenizer vLLM loads goes through it, and so does every copy vLLM makes), but only
where no method of the tokenizer's class, or of any base class, reads that attribute outside
``__init__``: a class that writes its vocabulary back from the list (Whisper's
``save_vocabulary``) keeps it.

``dropped`` lists ``(class name, attribute)`` for each list this process dropped.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Iterator

from vllm_edge.patches import Patch, check_params, source_of

BUILD_LISTS = ("_vocab", "_merges")

dropped: list[tuple[str, str]] = []


def _code_objects(value: Any) -> Iterator[types.CodeType]:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        for f in (value.fget, value.fset, value.fdel):
            if f is not None:
                yield from _code_objects(f)
        return
    if isinstance(value, types.FunctionType):
        value = value.__code__
    if isinstance(value, types.CodeType):
        yield value
        for const in value.co_consts:
            if isinstance(const, types.CodeType):
                yield from _code_objects(const)


@functools.lru_cache(maxsize=None)
def readers(cls: type, attr: str) -> tuple[str, ...]:
    """Methods of ``cls`` and its bases, ``__init__`` aside, whose code names ``attr``: as an
    attribute, or as a string a ``getattr`` could use."""
    found = []
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if name == "__init__":
                continue
            for code in _code_objects(value):
                if attr in code.co_names or attr in code.co_consts:
                    found.append(f"{klass.__name__}.{name}")
                    break
    return tuple(found)


def drop_build_lists(tokenizer: Any) -> list[str]:
    """Delete the construction lists no method of the tokenizer's class reads; the names dropped."""
    try:
        from transformers import TokenizersBackend
    except ImportError:
        return []
    if not isinstance(tokenizer, TokenizersBackend):
        return []
    state = getattr(tokenizer, "__dict__", {})
    out = []
    for attr in BUILD_LISTS:
        if attr in state and not readers(type(tokenizer), attr):
            del state[attr]
            out.append(attr)
            dropped.append((type(tokenizer).__name__, attr))
    return out


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    return "_merges" in src


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    check_params(attr, original, ("tokenizer",))

    @functools.wraps(original)
    def get_cached_tokenizer(tokenizer: Any) -> Any:
        drop_build_lists(tokenizer)
        return original(tokenizer)

    get_cached_tokenizer.__vllm_edge_patch__ = "tokenizer_build_lists"
    return get_cached_tokenizer


PATCH = Patch(
    name="tokenizer_build_lists",
    target="vllm.tokenizers.hf:get_cached_tokenizer",
    reason=(
        "the loaded tokenizer keeps the Python vocabulary and merges lists transformers built it "
        "from (about 200 MB for a 262k vocabulary), and vLLM keeps and copies that tokenizer"
    ),
    fixed_when="get_cached_tokenizer already releases the tokenizer's _merges",
    env_switch="VLLM_EDGE_PATCH_TOKENIZER_BUILD_LISTS",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
