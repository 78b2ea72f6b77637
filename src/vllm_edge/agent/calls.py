"""Extract tool calls from an assistant message, repairing the malformed ones small models emit.

Every repair is named so the loop can count it: a build that needs more repairs is a worse
agent even when it ends up passing.

Recovery kinds:
- ``bad_json``: arguments were not valid JSON but could be repaired (quotes, trailing commas,
  code fences, an empty string);
- ``bad_json_unrecoverable``: arguments could not be parsed; the model is told so;
- ``tool_name``: a tool name that matches after normalising case or a ``functions.`` prefix;
- ``unknown_tool``: no such tool; the model is told the valid names;
- ``text_tool_call``: no ``tool_calls`` field, but the content holds a call as JSON or as
  ``tap(3)``-style text.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from vllm_edge.common.phone_tools import TOOL_NAMES, TOOLS

# First required parameter of each tool, for positional text calls like tap(3).
_FIRST_PARAM = {t["function"]["name"]: (t["function"]["parameters"]["required"] or [None])[0] for t in TOOLS}
_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*|\s*```\s*$")
_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_PY_CALL = re.compile(r"\b(" + "|".join(TOOL_NAMES) + r")\s*\((.*?)\)", re.S)


@dataclass
class Call:
    name: str
    arguments: dict[str, Any] | None  # None when they could not be parsed
    id: str = ""
    source: str = "tool_calls"  # or "content"
    repairs: list[str] = field(default_factory=list)
    error: str | None = None  # message for the model when the call cannot be used
    error_kind: str | None = None


def _balanced_objects(text: str) -> list[str]:
    """Top-level {...} substrings, honouring JSON string quoting."""
    out, depth, start, in_str, esc = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
    return out


def parse_json_lenient(raw: str) -> tuple[Any, bool]:
    """(value, repaired). Raises ValueError when nothing sensible can be recovered."""
    try:
        return json.loads(raw), False
    except (json.JSONDecodeError, TypeError):
        pass
    s = _FENCE.sub("", str(raw)).strip()
    if s == "":
        return {}, True
    candidates = [s, re.sub(r",\s*([}\]])", r"\1", s)] + _balanced_objects(s)
    for c in candidates:
        try:
            return json.loads(c), True
        except json.JSONDecodeError:
            pass
        try:  # Python literals: single quotes, True/False/None
            val = ast.literal_eval(c)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(val, (dict, list, str, int, float, bool)) or val is None:
            return val, True
    raise ValueError(f"cannot parse arguments as JSON: {str(raw)[:120]!r}")


def _normalise_name(name: str) -> tuple[str | None, bool]:
    if name in TOOL_NAMES:
        return name, False
    n = str(name).strip().lower().removeprefix("functions.").strip()
    return (n, True) if n in TOOL_NAMES else (None, False)


def _make_call(name: Any, raw_args: Any, call_id: str, source: str) -> Call:
    call = Call(name=str(name or ""), arguments=None, id=call_id, source=source)
    if source == "content":
        call.repairs.append("text_tool_call")
    norm, renamed = _normalise_name(call.name)
    if norm is None:
        call.error = f"unknown tool {call.name!r}; use one of: {', '.join(TOOL_NAMES)}"
        call.error_kind = "unknown_tool"
        return call
    if renamed:
        call.repairs.append("tool_name")
    call.name = norm
    if isinstance(raw_args, dict):
        call.arguments = raw_args
        return call
    if raw_args is None:
        raw_args = ""
    try:
        value, repaired = parse_json_lenient(raw_args)
    except ValueError as exc:
        call.error = f"{exc}. Send the arguments as a JSON object."
        call.error_kind = "bad_json_unrecoverable"
        return call
    if repaired:
        call.repairs.append("bad_json")
    if not isinstance(value, dict):
        param = _FIRST_PARAM.get(norm)
        if param is None or isinstance(value, (list, dict)):
            call.error = f"arguments must be a JSON object, got {value!r}"
            call.error_kind = "bad_json_unrecoverable"
            return call
        value = {param: value}  # e.g. arguments "3" for tap
        if "bad_json" not in call.repairs:
            call.repairs.append("bad_json")
    call.arguments = value
    return call


def _from_object(obj: Any, call_id: str) -> Call | None:
    """A call written as JSON in the content, in the shapes models commonly use."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name") or obj.get("tool") or obj.get("tool_name") or obj.get("action")
    if not isinstance(name, str):
        return None
    args = next((obj[k] for k in ("arguments", "parameters", "args", "input") if k in obj), None)
    if args is None:  # flat form: {"name": "tap", "index": 3}
        args = {k: v for k, v in obj.items() if k not in ("name", "tool", "tool_name", "action", "type")}
    return _make_call(name, args, call_id, "content")


def _from_python_style(text: str, call_id: str) -> Call | None:
    m = _PY_CALL.search(text)
    if not m:
        return None
    name, inner = m.group(1), m.group(2).strip()
    try:
        node = ast.parse(f"f({inner})", mode="eval").body
        assert isinstance(node, ast.Call)
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        if node.args:
            args.setdefault(_FIRST_PARAM[name], ast.literal_eval(node.args[0]))
    except (SyntaxError, ValueError, AssertionError, KeyError):
        return None
    return _make_call(name, args, call_id, "content")


def calls_from_content(content: str, call_id: str = "text_call") -> list[Call]:
    if not content:
        return []
    blobs = [m.group(1) for m in _TOOL_CALL_TAG.finditer(content)] or [content]
    for blob in blobs:
        for obj_text in _balanced_objects(blob):
            try:
                obj, _ = parse_json_lenient(obj_text)
            except ValueError:
                continue
            call = _from_object(obj, call_id)
            if call is not None:
                return [call]
    call = _from_python_style(content, call_id)
    return [call] if call is not None else []


def extract_calls(message: dict[str, Any], turn: int = 0) -> list[Call]:
    """All calls in an OpenAI-style assistant message; [] when it holds none."""
    calls = []
    for i, tc in enumerate(message.get("tool_calls") or []):
        fn = (tc or {}).get("function") or {}
        call_id = (tc or {}).get("id") or f"call_{turn}_{i}"
        calls.append(_make_call(fn.get("name"), fn.get("arguments"), call_id, "tool_calls"))
    if calls:
        return calls
    return calls_from_content(message.get("content") or "", f"call_{turn}_text")
