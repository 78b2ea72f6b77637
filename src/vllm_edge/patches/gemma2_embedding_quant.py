"""Gemma 2 builds its token embedding with the checkpoint's quantization (docs/design/patches.md).

vLLM 0.32.0's ``Gemma2Model.__init__`` (``model_executor/models/gemma2.py``) calls
``VocabParallelEmbedding(vocab, hidden)`` without the ``quant_config`` and ``prefix`` that
Gemma 3's, Llama's and Qwen's pass, so a quantized checkpoint's embedding cannot load as stored:
it is held in bf16, and because Gemma 2's head is the embedding, every decode step reads the
whole 256k-row table in bf16 (a 2B model's embedding is 1.2 GB of it). The replacement runs the
original ``__init__`` with the module's ``VocabParallelEmbedding`` name bound, for that call only,
to one that adds the model's ``quant_config`` and the prefix ``<prefix>.embed_tokens``; a model
without a quantization config is built by the original untouched. Nothing is allocated twice:
the table is made once, in the checkpoint's format.

The GGUF repack keeps a Gemma 2 file's embedding codes only while this patch is switched on
(models/gguf_repack.py keys its build on the switch), so a build never outlives the engine that
can load it.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from typing import Any

from vllm_edge.patches import Patch, source_of

NAME = "VocabParallelEmbedding"
_swap = threading.Lock()  # the module global is shared: one construction rebinds it at a time


def _undecorated(init: Any) -> Any:
    """The model's own ``__init__`` under ``support_torch_compile``'s, which keeps it in its
    closure as ``old_init`` (and sets no ``__wrapped__``)."""
    inner = getattr(init, "__wrapped__", None)
    if inner is not None:
        return inner
    code, cells = getattr(init, "__code__", None), getattr(init, "__closure__", None) or ()
    free = dict(zip(code.co_freevars, cells)) if code is not None else {}
    return free["old_init"].cell_contents if "old_init" in free else init


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    # the model's own __init__ builds the table with the config
    src = source_of(_undecorated(current)) or ""
    call = re.search(rf"{NAME}\((.*?)\n\s*\)", src, re.S)
    return call is not None and "quant_config" in call.group(1)


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    module = sys.modules.get(owner.__module__)
    build = getattr(module, NAME, None)
    if build is None:
        raise LookupError(f"{owner.__module__} no longer names {NAME}: the embedding is built elsewhere")
    init = _undecorated(original)
    if NAME not in (getattr(getattr(init, "__code__", None), "co_names", ()) or ()):
        raise LookupError(f"{owner.__name__}.{attr} no longer calls {NAME} itself")

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any) -> None:
        quant_config = getattr(vllm_config, "quant_config", None)
        if quant_config is None:
            return original(self, *args, vllm_config=vllm_config, prefix=prefix, **kwargs)
        where = f"{prefix}.embed_tokens" if prefix else "embed_tokens"

        def embedding(*e_args: Any, **e_kwargs: Any) -> Any:
            e_kwargs.setdefault("quant_config", quant_config)
            e_kwargs.setdefault("prefix", where)
            return build(*e_args, **e_kwargs)

        with _swap:
            setattr(module, NAME, embedding)
            try:
                return original(self, *args, vllm_config=vllm_config, prefix=prefix, **kwargs)
            finally:
                setattr(module, NAME, build)

    __init__.__vllm_edge_patch__ = "gemma2_embedding_quant"
    return __init__


PATCH = Patch(
    name="gemma2_embedding_quant",
    target="vllm.model_executor.models.gemma2:Gemma2Model.__init__",
    reason=(
        "Gemma2Model builds its token embedding without the quantization config, so a quantized "
        "checkpoint's embedding (and the tied head that reads it) is held and read in bf16"
    ),
    fixed_when="the VocabParallelEmbedding call in Gemma2Model.__init__ passes quant_config",
    env_switch="VLLM_EDGE_PATCH_GEMMA2_EMBEDDING",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
