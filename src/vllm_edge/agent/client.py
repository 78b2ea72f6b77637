"""An OpenAI-compatible chat callable for the agent loop (e.g. `vllm-edge serve`)."""

from __future__ import annotations

from typing import Any

from vllm_edge.bench.engines.chat import TOOL_CHOICES, ChatFn, ContextOverflow

# vLLM's 400 for a prompt (or prompt + max_tokens) longer than max_model_len.
_OVERFLOW_MARK = "maximum context length"


def openai_chat(
    base_url: str,
    model: str,
    api_key: str = "EMPTY",
    temperature: float = 0.0,
    max_tokens: int = 256,
    timeout: float = 300.0,
    seed: int | None = None,
    tool_choice: str = "auto",
) -> ChatFn:
    """Return ``chat(messages, tools) -> assistant message dict`` backed by /v1/chat/completions.

    The server must accept tools (vLLM: ``--enable-auto-tool-choice --tool-call-parser ...``).
    A model that writes calls as text instead is still usable: the loop recovers those.
    ``tool_choice="required"`` asks the server to constrain every reply to a tool call.
    """
    from openai import BadRequestError, OpenAI

    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {tool_choice!r}")

    client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=1)

    def chat(messages: list[dict], tools: list[dict]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if seed is not None:
            kwargs["seed"] = seed
        try:
            resp = client.chat.completions.create(
                model=model, messages=messages, tools=tools, tool_choice=tool_choice,
                temperature=temperature, max_tokens=max_tokens, **kwargs,
            )
        except BadRequestError as exc:
            if _OVERFLOW_MARK in str(exc):
                raise ContextOverflow(str(exc)) from exc
            raise
        msg = resp.choices[0].message
        out: dict[str, Any] = {"role": "assistant", "content": msg.content,
                               # not part of the message: lets the suite tell a call cut by
                               # max_tokens from one never made
                               "finish_reason": resp.choices[0].finish_reason}
        if msg.tool_calls:
            out["tool_calls"] = [{
                "id": tc.id, "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            } for tc in msg.tool_calls if getattr(tc, "function", None) is not None]
        return out

    return chat
