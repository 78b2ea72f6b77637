"""A base model without a chat template is scored on plain completions of the same prompts."""

from __future__ import annotations

from types import SimpleNamespace

from vllm_edge.bench.fidelity import engine as fidelity


class _Base:
    chat_template = None

    def __call__(self, text):
        return SimpleNamespace(input_ids=[2, *map(ord, text)])  # <bos> first, as Gemma's adds

    def apply_chat_template(self, *a, **k):  # a base model has none to apply
        raise ValueError("no chat template")


def test_prompts_of_a_base_model_are_plain_completions():
    items = [{"messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": "c"}]}]
    assert fidelity.chat_prompt_ids(_Base(), items) == [[2, ord("a"), ord("b"), ord("\n"), ord("c")]]
