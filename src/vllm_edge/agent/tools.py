"""The action space on a device: argument validation and execution of the calls of
:data:`vllm_edge.common.phone_tools.TOOLS`."""

from __future__ import annotations

from typing import Any, Protocol

from vllm_edge.agent.uitree import UiTree
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.phone_tools import DIRECTIONS, KEYS, TOOL_NAMES


class Device(Protocol):
    """What the loop needs from a phone; SimDevice and AdbDevice both provide it."""

    def dump_ui(self) -> str: ...
    def tap(self, x: int, y: int) -> None: ...
    def type_text(self, text: str) -> None: ...
    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None: ...
    def press_key(self, key: int | str) -> None: ...
    def open_app(self, name: str) -> None: ...


class ToolError(EdgeError, ValueError):
    """A call the model can correct: missing or invalid arguments."""


# Finger paths on a 1080x2400 screen; "up" moves the finger up, so a list shows what is below.
SWIPES = {
    "up": (540, 1700, 540, 700),
    "down": (540, 700, 540, 1700),
    "left": (900, 1200, 180, 1200),
    "right": (180, 1200, 900, 1200),
}


def validate(name: str, args: dict[str, Any], tree: UiTree) -> tuple[dict[str, Any], bool]:
    """Check and normalise arguments. Returns (clean args, whether anything had to be coerced).

    Raises ToolError with a message the model can act on.
    """
    if name not in TOOL_NAMES:
        raise ToolError(f"unknown tool {name!r}; use one of: {', '.join(TOOL_NAMES)}")
    coerced = False

    def need(key: str) -> Any:
        if key not in args or args[key] is None:
            raise ToolError(f"{name} needs the argument {key!r}")
        return args[key]

    if name == "tap":
        raw = need("index")
        idx = raw
        if isinstance(raw, float) and raw.is_integer():
            idx = int(raw)
        elif isinstance(raw, str) and raw.strip().strip("[]").strip().isdigit():
            idx = int(raw.strip().strip("[]"))
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ToolError(f"tap index must be an integer, got {raw!r}")
        coerced = not isinstance(raw, int)
        if not 0 <= idx < len(tree):
            hi = len(tree) - 1
            raise ToolError(f"no element [{idx}] on this screen; valid indices are 0-{hi}" if hi >= 0
                            else "there are no elements on this screen to tap")
        return {"index": idx}, coerced
    if name == "type_text":
        raw = need("text")
        if not isinstance(raw, str):
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                return {"text": str(raw)}, True
            raise ToolError(f"type_text text must be a string, got {raw!r}")
        if raw == "":
            raise ToolError("type_text text is empty")
        return {"text": raw}, False
    if name == "swipe":
        raw = need("direction")
        d = str(raw).strip().lower()
        if d not in DIRECTIONS:
            raise ToolError(f"swipe direction must be one of {', '.join(DIRECTIONS)}, got {raw!r}")
        return {"direction": d}, d != raw
    if name == "press_key":
        raw = need("key")
        k = str(raw).strip().upper().removeprefix("KEYCODE_")
        if k not in KEYS:
            raise ToolError(f"key must be one of {', '.join(KEYS)}, got {raw!r}")
        return {"key": k}, k != raw
    if name == "open_app":
        raw = need("name")
        if not isinstance(raw, str) or not raw.strip():
            raise ToolError(f"open_app name must be a non-empty string, got {raw!r}")
        return {"name": raw.strip()}, raw.strip() != raw
    # task_complete: the declaration matters, the summary is only a note
    summary = args.get("summary")
    if summary is None:
        return {"summary": ""}, True
    return {"summary": str(summary)}, not isinstance(summary, str)


def execute(device: Device, tree: UiTree, name: str, args: dict[str, Any]) -> str:
    """Perform a validated action; returns a one-line description for the model."""
    if name == "tap":
        el = tree.elements[args["index"]]
        x, y = el.center
        device.tap(x, y)
        return f"Tapped [{el.index}] {el.label!r}"
    if name == "type_text":
        device.type_text(args["text"])
        return f"Typed {args['text']!r}"
    if name == "swipe":
        device.swipe(*SWIPES[args["direction"]], duration_ms=300)
        return f"Swiped {args['direction']}"
    if name == "press_key":
        device.press_key(args["key"])
        return f"Pressed {args['key']}"
    if name == "open_app":
        device.open_app(args["name"])
        return f"Opened {args['name']!r}"
    raise ToolError(f"{name} is not an action on the device")
