"""A text-only model skips the processor load that looks for a chat template
(docs/design/patches.md).

To resolve a chat template, vLLM 0.32.0's ``resolve_chat_template`` first asks
``_try_get_processor_chat_template``, which loads ``AutoProcessor`` for the model and caches it
for the life of the process. For a text-only model that builds a second full tokenizer (for a
262k vocabulary about 300 MB and 2 to 3 s, paid at every engine start: the renderer's warm-up
renders a chat), only to find that it is not a processor and has no template of its own.

The patch answers "no processor template" without loading anything when both hold:

- the model is text-only (``model_config.is_multimodal_model`` is false), and
- the tokenizer is a local folder from which ``AutoProcessor`` can only build a tokenizer: no
  ``processor_config.json``, ``preprocessor_config.json`` or ``video_preprocessor_config.json``,
  and no ``processor_class`` or ``AutoProcessor`` auto-map in ``tokenizer_config.json`` or
  ``config.json``.

Any other call runs the original. The template then comes from the tokenizer, as it would have.
``skipped`` counts the loads this process avoided.
"""

from __future__ import annotations

import contextvars
import functools
import json
from pathlib import Path
from typing import Any

from vllm_edge.patches import Patch, check_params, source_of

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json",
                   "video_preprocessor_config.json")
CONFIG_FILES = ("tokenizer_config.json", "config.json")

skipped = 0

# Set by resolve_chat_template for the duration of the call: True for a text-only model.
_text_only: contextvars.ContextVar[bool] = contextvars.ContextVar("vllm_edge_text_only", default=False)


def _names_a_processor(path: Path) -> bool:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # unreadable: let transformers decide, as upstream does
    if not isinstance(config, dict):
        return True
    auto_map = config.get("auto_map")
    return bool(config.get("processor_class")) or (isinstance(auto_map, dict)
                                                   and "AutoProcessor" in auto_map)


def only_a_tokenizer(name_or_path: Any) -> bool:
    """Whether ``AutoProcessor`` can build nothing but a tokenizer from this folder."""
    folder = Path(str(name_or_path))
    if not folder.is_dir():
        return False  # a hub id: its files are not here to look at
    if any((folder / name).exists() for name in PROCESSOR_FILES):
        return False
    return not any((folder / name).is_file() and _names_a_processor(folder / name)
                   for name in CONFIG_FILES)


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    src = source_of(getattr(owner, "resolve_chat_template", current))
    if src is None:
        return False
    return "is_multimodal_model" in src


_PARAMS = {
    "resolve_chat_template": ("tokenizer", "chat_template", "tools", "model_config"),
    "_try_get_processor_chat_template": ("tokenizer", "revision", "code_revision",
                                         "trust_remote_code"),
}


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    check_params(attr, original, _PARAMS[attr])
    if attr == "resolve_chat_template":
        @functools.wraps(original)
        def resolve_chat_template(tokenizer: Any, chat_template: Any, tools: Any, *,
                                  model_config: Any) -> Any:
            token = _text_only.set(not getattr(model_config, "is_multimodal_model", True))
            try:
                return original(tokenizer, chat_template, tools, model_config=model_config)
            finally:
                _text_only.reset(token)

        resolve_chat_template.__vllm_edge_patch__ = "processor_template_probe"
        return resolve_chat_template

    # folder -> only_a_tokenizer, read once: every chat render resolves the template, and
    # upstream's own answer is cached by the same name for the life of the process
    folders: dict[str, bool] = {}

    @functools.wraps(original)
    def probe(tokenizer: Any, **kwargs: Any) -> Any:
        global skipped
        if _text_only.get():
            name = str(getattr(tokenizer, "name_or_path", ""))
            if name not in folders:
                folders[name] = only_a_tokenizer(name)
            if folders[name]:
                skipped += 1
                return None
        return original(tokenizer, **kwargs)

    probe.__vllm_edge_patch__ = "processor_template_probe"
    return probe


PATCH = Patch(
    name="processor_template_probe",
    target=("vllm.renderers.hf:resolve_chat_template",
            "vllm.renderers.hf:_try_get_processor_chat_template"),
    reason=(
        "to find a chat template, every engine start loads AutoProcessor, for a text-only model "
        "a second full tokenizer, and keeps it cached"
    ),
    fixed_when="resolve_chat_template consults model_config.is_multimodal_model",
    env_switch="VLLM_EDGE_PATCH_PROCESSOR_TEMPLATE_PROBE",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
