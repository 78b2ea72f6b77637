"""The llama.cpp arm's pieces that need no model: the grammar text, the reply parser (vLLM's
hermes reading), the messages handed to the template, the template choice and the CLI's
checks. The arm on a real GGUF is in test_agent_llamacpp_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vllm_edge
from vllm_edge.bench.engines import llamacpp_chat as lc
from vllm_edge.common.phone_tools import TOOLS

DATA = Path(vllm_edge.__file__).resolve().parent / "data"


def test_parse_reply_reads_calls_as_vllms_hermes_parser():
    one = '<tool_call>\n{"name": "tap", "arguments": {"index": 3}}\n</tool_call>'
    assert lc.parse_reply(one) == (None, [{"name": "tap", "arguments": '{"index": 3}'}])
    two = 'Sure.\n<tool_call>{"name": "tap", "arguments": {"index": 1}}</tool_call>' \
          '<tool_call>{"name": "type_text", "arguments": {"text": "é </tool_call> x"}}</tool_call>'
    content, calls = lc.parse_reply(two)
    assert content == "Sure.\n"
    # the end tag inside a JSON string does not end the call; non-ASCII kept as vLLM keeps it
    assert [c["name"] for c in calls] == ["tap", "type_text"]
    assert calls[1]["arguments"] == '{"text": "é </tool_call> x"}'
    # one block that does not parse (here: cut by max_tokens) and no call comes back
    cut = one + '<tool_call>\n{"name": "tap", "argu'
    assert lc.parse_reply(cut) == (cut, [])
    assert lc.parse_reply("just text") == ("just text", [])
    assert lc.parse_reply('<tool_call>{"arguments": {}}</tool_call>')[1] == []


def test_template_messages_parse_arguments_and_leave_the_callers_alone():
    msgs = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "tap", "arguments": '{"index": 2}'}},
        {"id": "b", "type": "function", "function": {"name": "tap", "arguments": "{broken"}},
        {"id": "c", "type": "function", "function": {"name": "tap", "arguments": ""}}]},
        {"role": "assistant", "content": "x", "tool_calls": []}]
    before = json.dumps(msgs)
    out = lc.template_messages(msgs)
    assert json.dumps(msgs) == before
    assert [tc["function"]["arguments"] for tc in out[0]["tool_calls"]] == [{"index": 2}, {}, {}]
    assert "tool_calls" not in out[1]


def test_the_prompt_is_the_serve_template_with_the_tools():
    msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "tap", "arguments": '{"index": 2}'}}]},
            {"role": "tool", "tool_call_id": "a", "content": "Tapped"}]
    text = lc.render((DATA / "smollm2_tools.jinja").read_text(), msgs, TOOLS)
    assert text.startswith("<|im_start|>system\nSYS\n\nYou can call functions.")
    assert json.dumps(TOOLS[0]["function"]) in text  # tools as vLLM renders them: tojson, keys kept in order
    call = '<tool_call>\n{"name": "tap", "arguments": {"index": 2}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n" in text
    assert text.endswith("<tool_response>\nTapped\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_choose_template():
    smol = {"general.basename": "smollm2", "general.size_label": "135M", "tokenizer.chat_template": "{{ x }}"}
    text, source = lc.choose_template(smol, None)
    assert source.endswith("smollm2_tools.jinja") and "<tool_call>" in text
    own = {"general.basename": "other", "tokenizer.chat_template": "... <tool_call> ..."}
    assert lc.choose_template(own, None) == ("... <tool_call> ...", "gguf:tokenizer.chat_template")
    with pytest.raises(ValueError, match="no tool-call chat template known for this GGUF"):
        lc.choose_template({"general.basename": "other", "tokenizer.chat_template": "{{ x }}"}, None)
    given = DATA / "smollm2_tools.jinja"
    assert lc.choose_template({}, given)[1] == str(given)


def test_free_text_never_contains_the_trigger():
    rules = lc._free_text_rules("<tool_call>", "text")
    assert rules["text-0"] == '( "<" text-1 | [^<] text-0 )?'
    assert rules["text-10"] == '( "<" text-1 | [^<>] text-0 )?'  # ">" would complete the trigger
    # a word whose prefix repeats: after "aa" another "a" keeps two matched
    assert lc._free_text_rules("aab", "x")["x-2"] == '( "a" x-2 | [^ab] x-0 )?'


@pytest.mark.parametrize("tool_choice,root", [("required", "call+"), ("auto", "text-0 ( call text-0 )*")])
def test_tool_grammar_mirrors_vllms_hermes_structural_tag(tool_choice, root):
    pytest.importorskip("llama_cpp")
    rules = dict(line.split(" ::= ", 1) for line in lc.tool_grammar(TOOLS, tool_choice).splitlines())
    assert rules["root"] == root
    assert rules["call"] == ('"<tool_call>" ( "\\n" call-body "}\\n</tool_call>" '
                             '| call-body "}</tool_call>" )')
    assert rules["call-body"].startswith('"{\\"name\\": \\"" ( "tap\\", \\"arguments\\": " tool0-args | ')
    assert rules["tool2-args-direction"] == '"\\"up\\"" | "\\"down\\"" | "\\"left\\"" | "\\"right\\""'
    assert "\\x00-\\x1F" in rules["char"]  # no raw control characters inside strings


def test_tool_grammar_refuses_what_it_cannot_build():
    pytest.importorskip("llama_cpp")
    with pytest.raises(ValueError, match="tool_choice must be one of auto, required"):
        lc.tool_grammar(TOOLS, "none")
    with pytest.raises(ValueError, match="no tools"):
        lc.tool_grammar([], "required")


@pytest.mark.parametrize("argv,message", [
    (["--engine", "llamacpp"], "--engine llamacpp needs --gguf PATH"),
    (["--engine", "llamacpp", "--gguf", "/nonexistent.gguf"], "--gguf /nonexistent.gguf: no such file"),
    (["--engine", "llamacpp", "--gguf", __file__, "--base-url", "http://127.0.0.1:9/v1"],
     "no --base-url or --serve"),
    (["--engine", "llamacpp", "--gguf", __file__, "--threads", "0"], "--threads 0: must be at least 1"),
    (["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--gguf", __file__],
     "are for --engine llamacpp"),
])
def test_cli_checks_the_engine_flags(argv, message, capsys):
    from vllm_edge.cli import main

    assert main(["agent", "run", "--tasks", "wifi_on", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_reports_a_file_llama_cpp_cannot_load(tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    from vllm_edge.cli import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert main(["agent", "run", "--engine", "llamacpp", "--gguf", str(bad), "--tasks", "wifi_on",
                 "--out", ""]) == 2
    assert "error:" in capsys.readouterr().err
