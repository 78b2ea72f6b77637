"""`run`'s choice between a chat and a plain completion on a keep-alive server, without one:
the server's model folder decides."""

from __future__ import annotations

import json

import pytest

from vllm_edge.cli import run
from vllm_edge.common.errors import UsageError
from vllm_edge.serving import keepalive


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The folder the (absent) server says it loaded."""
    monkeypatch.setattr(keepalive, "served_root", lambda rec: tmp_path)
    return tmp_path


def test_a_model_with_a_template_is_a_chat(served):
    (served / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ m }}"}))
    assert run.serves_base_model(None, "m.gguf", interactive=True) is False
    assert run.serves_base_model(None, "m.gguf", interactive=False) is False


def test_a_base_model_completes_a_prompt_and_refuses_a_chat(served):
    (served / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    assert run.serves_base_model(None, "m.gguf", interactive=False) is True
    with pytest.raises(UsageError, match=r"--model m\.gguf: the model has no chat template .* "
                                          r"pass --prompt TEXT"):
        run.serves_base_model(None, "m.gguf", interactive=True)
