"""The phone's action space as OpenAI tool schemas: the six tools the agent offers a model
(``vllm_edge.agent.tools`` validates and performs their calls), which ``bench constrained``
and the tool-call tests constrain decoding to. Data only: no device, no engine."""

from __future__ import annotations

KEYS = ("BACK", "HOME", "ENTER", "DEL")
DIRECTIONS = ("up", "down", "left", "right")


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required},
    }}


TOOLS: list[dict] = [
    _fn("tap", "Tap the screen element with this index in the element list.",
        {"index": {"type": "integer", "description": "element index, the number in [brackets]"}}, ["index"]),
    _fn("type_text", "Type text into the focused input field (tap the field first).",
        {"text": {"type": "string"}}, ["text"]),
    _fn("swipe", "Swipe the screen. 'up' scrolls a list to show items further down.",
        {"direction": {"type": "string", "enum": list(DIRECTIONS)}}, ["direction"]),
    _fn("press_key", "Press a system key: BACK, HOME, ENTER or DEL (delete one character).",
        {"key": {"type": "string", "enum": list(KEYS)}}, ["key"]),
    _fn("open_app", "Launch an app by its name, e.g. 'Settings' or 'Clock'.",
        {"name": {"type": "string"}}, ["name"]),
    _fn("task_complete", "Call this once the task is done (also if it was already done before you started).",
        {"summary": {"type": "string", "description": "one sentence on what you did"}}, ["summary"]),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
