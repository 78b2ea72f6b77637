"""Models: the embedded default model, GGUF import, synthetic checkpoints, speech.

:func:`register` is called by the plugin in every vLLM process; it is idempotent and imports
no model code (vLLM loads a registered class by name when a checkpoint needs it).
"""

from __future__ import annotations

from vllm_edge.common.registration import Registration


def register() -> list[Registration]:
    """Register the model classes vLLM lacks (the talker's); returns what was registered."""
    from vllm_edge.models.speech import talker

    return [talker.register()]
