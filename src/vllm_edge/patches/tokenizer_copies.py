"""vLLM's copies of the tokenizer stop rebuilding its caches, and its thread pool starts with
one copy (docs/design/patches.md).

vLLM 0.32.0 wraps every tokenizer in ``get_cached_tokenizer``, whose class caches the vocabulary
and the special tokens, and defines ``__reduce__`` as "call get_cached_tokenizer again on the
original tokenizer". ``copy.copy`` and ``copy.deepcopy`` go through ``__reduce__`` when a class
has no ``__copy__``/``__deepcopy__``, so each copy builds the whole vocabulary dict again (for a
262k vocabulary about 30 MB and half a second each). The renderer copies the tokenizer, the thread
pool copies it again, and the pool deep-copies it ``renderer_num_workers + 1`` times up front.

The patch gives the cached class a ``__copy__`` (a new instance over the same attributes: what
the ``__reduce__`` route gives, without the rebuild) and a ``__deepcopy__`` (the attributes,
Rust tokenizer included, deep-copied; the cached vocabulary shared, as every user of the cached
tokenizer already shares it). A subclass, vLLM's ``TokenizerPool``, still copies through its own
``__reduce__``. And the pool starts with one deep copy instead of two: the original's borrow
already deep-copies another one when the pool is empty and keeps it, so a second concurrent
render still gets its own copy, made when it first happens instead of at every start.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from vllm_edge.patches import Patch, check_params, source_of

EAGER_POOL_COPIES = 1


def _copiers(cls: type) -> tuple[Any, Any]:
    def __copy__(self: Any) -> Any:
        if type(self) is not cls:  # a subclass copies as it defines (TokenizerPool.__reduce__)
            fn, args = self.__reduce__()[:2]
            return fn(*args)
        new = object.__new__(cls)
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self: Any, memo: dict) -> Any:
        if type(self) is not cls:
            fn, args = self.__reduce__()[:2]
            return fn(*copy.deepcopy(args, memo))
        new = object.__new__(cls)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    return __copy__, __deepcopy__


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(current)
    if src is None:
        return False
    if attr == "get_cached_tokenizer":
        return "__copy__" in src
    return "range(copies)" not in src  # the pool no longer fills itself up front


_PARAMS = {"get_cached_tokenizer": ("tokenizer",), "maybe_make_thread_pool": ("tokenizer", "copies")}


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    check_params(attr, original, _PARAMS[attr])
    if attr == "get_cached_tokenizer":
        @functools.wraps(original)
        def get_cached_tokenizer(tokenizer: Any) -> Any:
            cached = original(tokenizer)
            cls = type(cached)
            if "__copy__" not in vars(cls) and "__deepcopy__" not in vars(cls):
                cls.__copy__, cls.__deepcopy__ = _copiers(cls)
            return cached

        get_cached_tokenizer.__vllm_edge_patch__ = "tokenizer_copies"
        return get_cached_tokenizer

    @functools.wraps(original)
    def maybe_make_thread_pool(tokenizer: Any, copies: int = 1) -> Any:
        return original(tokenizer, min(copies, EAGER_POOL_COPIES))

    maybe_make_thread_pool.__vllm_edge_patch__ = "tokenizer_copies"
    return maybe_make_thread_pool


PATCH = Patch(
    name="tokenizer_copies",
    # the renderer holds its own binding of maybe_make_thread_pool; TokenizerPool.__reduce__
    # reaches the module's
    target=("vllm.tokenizers.hf:get_cached_tokenizer",
            "vllm.tokenizers.hf:maybe_make_thread_pool",
            "vllm.renderers.hf:maybe_make_thread_pool"),
    reason=(
        "every copy of the cached tokenizer rebuilds its vocabulary cache through __reduce__, "
        "and the renderer's thread pool deep-copies the tokenizer twice at every start"
    ),
    fixed_when=("get_cached_tokenizer's class defines __copy__, and maybe_make_thread_pool no "
                "longer fills its pool up front"),
    env_switch="VLLM_EDGE_PATCH_TOKENIZER_COPIES",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
