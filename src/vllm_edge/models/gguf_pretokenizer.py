"""The pre-tokenizer a GGUF file names (``tokenizer.ggml.pre``), as the tokenizer we save.

transformers builds a GGUF's tokenizer by architecture: a ``qwen2`` file gets the Qwen2
tokenizer class, which on every later load imposes Qwen2's split regex whatever the file says,
and a ``llama`` file gets GPT-2's split even where the file asks for single digits (SmolLM2's
``smollm``). llama.cpp splits by the file's own name. So for the BPE files whose names we map
(the table below) the saved tokenizer carries that split itself, under the generic class that
loads ``tokenizer.json`` as written; any other name keeps transformers' reading, with a warning.
One limit is transformers': it loads a ``qwen2`` model's tokenizer as Qwen2Tokenizer whatever the
saved class (``FORCED_SPLIT``), so a qwen2 file naming another split is warned about, not mended.
Checked against llama.cpp's own tokenizer on files of each mapped name, loaded as a build is
(``tests/models/test_gguf_pretokenizer.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger("vllm_edge.models")


def _gpt2() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _qwen2() -> Any:
    from tokenizers import Regex, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# llama.cpp's tokenizer.ggml.pre names -> the same split in Hugging Face's tokenizers
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {"gpt-2": _gpt2, "smollm": _smollm, "qwen2": _qwen2}
# architectures whose tokenizer transformers (5.x) loads as its own class whatever the saved
# tokenizer_config names (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), with the split that class
# builds: a file of one naming another split is tokenized that class's way by vLLM too
FORCED_SPLIT = {"qwen2": "qwen2"}


def honour(tok: Any, metadata: dict, src: Path) -> Any:
    """``tok`` (transformers' tokenizer of the file) splitting text as the file's
    ``tokenizer.ggml.pre`` says; a SentencePiece file (no pre-tokenizer) is returned as it is."""
    from transformers import TokenizersBackend

    if metadata.get("tokenizer.ggml.model") != "gpt2":
        return tok
    name = metadata.get("tokenizer.ggml.pre")
    build = PRE_TOKENIZERS.get(name)
    if build is None:
        logger.warning("%s: pre-tokenizer %r (tokenizer.ggml.pre) is not one we map (%s); the "
                       "tokenizer splits text as transformers does for this architecture, which "
                       "llama.cpp may not", src, name, ", ".join(PRE_TOKENIZERS))
        return tok
    arch = metadata.get("general.architecture")
    if FORCED_SPLIT.get(arch, name) != name:
        logger.warning("%s: the file names the pre-tokenizer %r, but transformers loads every %s model's "
                       "tokenizer as its own class, which splits text as %r: vLLM will tokenize some text "
                       "unlike llama.cpp (runs of newlines and spaces)", src, name, arch, FORCED_SPLIT[arch])
    backend = tok.backend_tokenizer
    backend.pre_tokenizer = build()
    backend.normalizer = None  # llama.cpp normalizes no BPE text
    # the generic class is what save_pretrained names, and it loads tokenizer.json as written;
    # an architecture's class (Qwen2Tokenizer) would rebuild its own split on every load
    tok.__class__ = TokenizersBackend
    return tok
