"""patches/hermes_json_end: a hermes call ends at the first </tool_call> outside a JSON string.

The pinned tests show, on vLLM 0.32.0 without the patch, that the grammar vLLM applies to a
named call accepts an argument containing ``</tool_call>`` and that the unpatched parser then
loses the call; the others show the patch is connected and reads such calls back, streamed
or not, without changing what upstream already read correctly.
"""

from __future__ import annotations

import json

import pytest

from vllm_edge.bench import prompts
from vllm_edge.patches import hermes_json_end as hj

VLLM_PIN = "0.32.0"
ARGS = {"directory": "/etc/myapp</tool_call>", "pattern": "*.yaml"}
# a call the structural tag accepts, in both of its begin/end spellings
CALLS = [
    '<tool_call>{"name": "search_files", "arguments": ' + json.dumps(ARGS) + '}</tool_call>',
    '<tool_call>\n{"name": "search_files", "arguments": ' + json.dumps(ARGS) + '}\n</tool_call>',
]


def _vllm_version() -> str:
    import vllm

    return vllm.__version__.split("+")[0]


@pytest.fixture
def parser_cls():
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    return Hermes2ProToolParser


@pytest.fixture
def parser(parser_cls):
    from transformers import PreTrainedTokenizerFast

    from vllm_edge.patches import load_all

    load_all()
    # the parser only needs a tokenizer object; a tiny one keeps this test offline
    from tokenizers import Tokenizer, models

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, "<unk>")))
    return parser_cls(tok)


def _named_request():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "find yaml"}], tools=prompts.TOOLS,
        tool_choice={"type": "function", "function": {"name": "search_files"}})


@pytest.mark.skipif(_vllm_version() != VLLM_PIN, reason=f"pinned to vLLM {VLLM_PIN}")
def test_the_named_call_grammar_accepts_the_end_tag_inside_a_string():
    import xgrammar as xgr
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
    from xgrammar.testing import _is_grammar_accept_string

    req = _named_request()
    tag = get_model_structural_tag("hermes", req.tools, req.tool_choice, reasoning=False,
                                   strict_level=ToolStrictLevel.PARAMETER)
    grammar = xgr.Grammar.from_structural_tag(json.dumps(tag.model_dump()))
    for text in CALLS:
        assert _is_grammar_accept_string(grammar, text)


@pytest.mark.skipif(_vllm_version() != VLLM_PIN, reason=f"pinned to vLLM {VLLM_PIN}")
def test_unpatched_parser_loses_the_call_on_vllm_032(parser, parser_cls):
    original = parser_cls.extract_tool_calls.__wrapped__
    for text in CALLS:
        info = original(parser, text, _named_request())
        assert not info.tools_called and info.tool_calls == [] and info.content == text
    # streamed: the arguments stop at the tag and never parse
    regions = parser_cls._extract_tool_call_jsons.__wrapped__(parser, CALLS[0])
    assert regions[0][1] is True
    with pytest.raises(ValueError):
        json.loads(regions[0][0])
    assert not hj._is_fixed_upstream(parser_cls, "extract_tool_calls", original)
    assert not hj._is_fixed_upstream(parser_cls, "_extract_tool_call_jsons",
                                     parser_cls._extract_tool_call_jsons.__wrapped__)


def test_patch_is_connected(parser_cls):
    from vllm_edge.patches import State, load_all

    state = {p.name: p for p in load_all()}["hermes_json_end"]
    assert state.state is State.APPLIED
    assert getattr(parser_cls.extract_tool_calls, "__vllm_edge_patch__", None) == "hermes_json_end"
    assert getattr(parser_cls._extract_tool_call_jsons, "__vllm_edge_patch__", None) == "hermes_json_end"


def test_patched_parser_reads_the_call(parser):
    for text in CALLS:
        info = parser.extract_tool_calls(text, _named_request())
        assert info.tools_called and len(info.tool_calls) == 1
        assert info.tool_calls[0].function.name == "search_files"
        assert json.loads(info.tool_calls[0].function.arguments) == ARGS
        assert info.content is None


def test_patched_parser_keeps_upstream_reading(parser):
    two = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a \\" </tool_call>"}}'
           '\n</tool_call>')
    info = parser.extract_tool_calls("Sure. " + two, _named_request())
    assert [json.loads(c.function.arguments) for c in info.tool_calls] == [
        {"city": "Paris"}, {"city": 'a " </tool_call>'}]
    assert info.content == "Sure. "
    # no call, or one cut by max_tokens: upstream's answer (content back, no calls)
    for text in ("plain prose", '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'):
        info = parser.extract_tool_calls(text, _named_request())
        assert not info.tools_called and info.content == text


def test_patched_stream_joins_to_the_arguments(parser):
    """Feed the call a few characters at a time; the streamed argument deltas join into the
    call's arguments."""
    text = CALLS[1]
    name, args, prev = None, "", ""
    for i in range(3, len(text) + 3, 3):
        cur = text[:i]
        delta = parser.extract_tool_calls_streaming(prev, cur, cur[len(prev):], [], [], [],
                                                    _named_request())
        prev = cur
        for tc in (delta.tool_calls if delta else []):
            fn = tc.function
            fn = fn if isinstance(fn, dict) else fn.model_dump(exclude_none=True)
            name = name or fn.get("name")
            args += fn.get("arguments") or ""
    assert name == "search_files"
    assert json.loads(args) == ARGS


@pytest.mark.parametrize("text,expected", [
    ('{"a": "x</t>"}</t>', 14),
    ('{"a": "\\"</t>"}</t>', 15),
    ('{"a": 1}', -1),
    ('</t>', 0),
])
def test_end_outside_string(text, expected):
    assert hj.end_outside_string(text, 0, "</t>") == expected
