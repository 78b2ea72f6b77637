"""System prompts for the agent loop, by name, so a result says which one it ran with.

``default`` is the loop's own prompt: the task format and the tool list in one sentence each.
``example`` adds one worked example in the exact call format the chat template asks for,
on a task that is not in the suite (opening the Camera), so it shows the format without
showing a solution.
"""

from __future__ import annotations

from vllm_edge.agent.loop import SYSTEM_PROMPT

_EXAMPLE = """

Example, for the task "Open the Camera app.":
Current screen:
App: com.android.launcher3
[0] TextView "Phone"
[1] TextView "Messages"
[2] TextView "Camera"
You answer: <tool_call>{"name": "tap", "arguments": {"index": 2}}</tool_call>
Current screen:
App: com.android.camera
[0] ImageButton "Shutter"
You answer: <tool_call>{"name": "task_complete", "arguments": {"summary": "Opened the Camera app."}}</tool_call>"""

PROMPTS: dict[str, str] = {
    "default": SYSTEM_PROMPT,
    "example": SYSTEM_PROMPT + _EXAMPLE,
}


def prompt(name: str) -> str:
    try:
        return PROMPTS[name]
    except KeyError:
        raise ValueError(f"unknown prompt {name!r}; one of {', '.join(PROMPTS)}") from None
