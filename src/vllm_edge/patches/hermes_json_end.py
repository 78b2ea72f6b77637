"""Hermes tool calls end at the first ``</tool_call>`` outside a JSON string.

vLLM 0.32.0's ``Hermes2ProToolParser`` cuts a call's JSON at the first ``</tool_call>`` in
the text (a lazy regex in ``extract_tool_calls``, ``str.find`` in
``_extract_tool_call_jsons`` when streaming). The structural tag vLLM builds for the same
parser (``structural_tag_registry._hermes_tool_tags``) holds the arguments to the tool's
JSON schema, and a JSON string may contain ``</tool_call>``. A named or ``required`` call
whose string argument contains the end tag is therefore well formed by the grammar, yet
the parser sees ``{"name": ..., "arguments": {"x": "...`` and fails with "Unterminated
string": no ``tool_calls``, ``finish_reason: "stop"``. Streamed, the arguments stop at the
tag and never become valid JSON.

The patch replaces both with a scan that skips ``</tool_call>`` while inside a JSON
string. Text the original reads correctly is read the same way; anything the new scan
still cannot parse falls back to the original method.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from vllm_edge.patches import Patch

logger = logging.getLogger("vllm_edge.patches.hermes_json_end")

_MODULE = "vllm.tool_parsers.hermes_tool_parser"
# a well-formed call whose string argument holds the end tag; upstream is fixed when it
# reads this call back
_PROBE_ARGS = {"note": "a </tool_call> b"}
_PROBE = ('<tool_call>\n{"name": "f", "arguments": ' + json.dumps(_PROBE_ARGS)
          + '}\n</tool_call>')


def end_outside_string(text: str, start: int, end_tag: str) -> int:
    """Index of the first ``end_tag`` at or after ``start`` that is not inside a JSON
    string, or -1."""
    in_str = escaped = False
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif text.startswith(end_tag, i):
            return i
        i += 1
    return -1


def call_regions(text: str, start_tag: str, end_tag: str) -> list[tuple[str, bool]]:
    """(JSON text, closed by ``end_tag``) for each call in ``text``."""
    out: list[tuple[str, bool]] = []
    pos = 0
    while (begin := text.find(start_tag, pos)) != -1:
        body = begin + len(start_tag)
        stop = end_outside_string(text, body, end_tag)
        if stop == -1:
            out.append((text[body:], False))
            break
        out.append((text[body:stop], True))
        pos = stop + len(end_tag)
    return out


class _Probe:
    """Just enough of a parser instance for the unpatched methods to run on."""
    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"

    def __init__(self, cls: Any) -> None:
        self.tool_call_regex = cls.tool_call_regex


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    probe = _Probe(owner)
    # the unpatched parser logs a traceback for the probe; it is expected, not news
    parser_log = logging.getLogger(_MODULE)
    was_disabled, parser_log.disabled = parser_log.disabled, True
    try:
        if attr == "extract_tool_calls":
            info = current(probe, _PROBE, None)
            calls = info.tool_calls if info.tools_called else []
            return len(calls) == 1 and json.loads(calls[0].function.arguments) == _PROBE_ARGS
        regions = current(probe, _PROBE)
        if not regions or not regions[0][1]:
            return False
        return json.loads(regions[0][0])["arguments"] == _PROBE_ARGS
    except Exception:
        return False
    finally:
        parser_log.disabled = was_disabled


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    if attr == "extract_tool_calls":
        return _make_extract(original)
    return _make_stream_regions(original)


def _make_extract(original: Any) -> Any:
    from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall

    def extract_tool_calls(self: Any, model_output: str, request: Any) -> Any:
        start, end = self.tool_call_start_token, self.tool_call_end_token
        if start not in model_output:
            return original(self, model_output, request)
        try:
            calls = []
            for body, _closed in call_regions(model_output, start, end):
                obj = json.loads(body)
                calls.append(ToolCall(type="function", function=FunctionCall(
                    name=obj["name"],
                    arguments=json.dumps(obj["arguments"], ensure_ascii=False))))
        except Exception:
            # what this scan cannot read either gets upstream's handling (and its log line)
            return original(self, model_output, request)
        content = model_output[: model_output.find(start)]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=calls,
                                            content=content or None)

    extract_tool_calls.__wrapped__ = original
    extract_tool_calls.__vllm_edge_patch__ = "hermes_json_end"
    return extract_tool_calls


def _make_stream_regions(original: Any) -> Any:
    from vllm.tool_parsers.utils import is_complete_json, partial_tag_overlap

    def _extract_tool_call_jsons(self: Any, text: str) -> list[tuple[str, bool]]:
        out = []
        for body, closed in call_regions(text, self.tool_call_start_token,
                                         self.tool_call_end_token):
            if closed:
                out.append((body.strip(), True))
                continue
            # hold back a partial end tag until the next delta shows what it is
            overlap = partial_tag_overlap(body, self.tool_call_end_token)
            body = (body[:-overlap] if overlap else body).strip()
            out.append((body, is_complete_json(body) if body else False))
        return out

    _extract_tool_call_jsons.__wrapped__ = original
    _extract_tool_call_jsons.__vllm_edge_patch__ = "hermes_json_end"
    return _extract_tool_call_jsons


PATCH = Patch(
    name="hermes_json_end",
    target=(f"{_MODULE}:Hermes2ProToolParser.extract_tool_calls",
            f"{_MODULE}:Hermes2ProToolParser._extract_tool_call_jsons"),
    reason=(
        "the hermes parser ends a call at the first </tool_call> even inside a JSON string, "
        "which the structural tag for named/required tool_choice allows: the call is lost "
        "(non-streaming) or its arguments stop mid-string (streaming)"
    ),
    fixed_when=(
        "the unpatched methods read back a call whose string argument contains </tool_call>"
    ),
    env_switch="VLLM_EDGE_PATCH_HERMES_JSON_END",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
