"""`run`'s own helpers (serving/run.py), without an engine."""

from __future__ import annotations

from vllm_edge.models import store
from vllm_edge.serving.run import DEFAULT_SYSTEM, system_message


def test_the_system_message_is_the_flags_else_the_embedded_models_own_else_runs_generic():
    text, source = system_message("default")
    assert text == store.resolve_key("default").system == "" and "measured" in source
    assert system_message("/models/some.gguf") == (DEFAULT_SYSTEM, "run's default")
    assert system_message("default", "Be brief.") == ("Be brief.", "--system")
    assert system_message("default", "") == (None, "--system")  # '' sends none
