"""The chat contract of the agent loop's engines: ``chat(messages, tools) -> assistant
message dict``, OpenAI's message and tool formats, and the exception that says the request
does not fit. :func:`vllm_edge.agent.client.openai_chat` and
:class:`vllm_edge.bench.engines.llamacpp_chat.LlamaCppChat` both keep it.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_edge.common.errors import EdgeError

ChatFn = Callable[[list[dict], list[dict]], dict]

# "auto": the model decides whether to call; "required": the server constrains decoding so
# every reply is a call of one of the offered tools (vLLM: structured outputs via xgrammar).
TOOL_CHOICES = ("auto", "required")


class ContextOverflow(EdgeError):
    """The request (history + screen + reply budget) does not fit the model's context.

    Chat functions raise it so the loop can drop old turns and ask again.
    """
