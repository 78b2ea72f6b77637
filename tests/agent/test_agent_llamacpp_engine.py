"""The agent suite's llama.cpp arm on a real GGUF (the embedded SmolLM2-135M Q4_1): the grammar
llama.cpp compiles accepts the calls vLLM's structural tag accepts and nothing else, constrained
turns come back as calls that satisfy their tool's schema, the prompt is the one vLLM renders,
and `agent run --engine llamacpp` writes its report."""

from __future__ import annotations

import ctypes
import json
import math

import pytest

from support.llamacpp import default_gguf, need_llama_cpp
from vllm_edge.agent import uitree
from vllm_edge.agent.loop import SYSTEM_PROMPT
from vllm_edge.agent.suite import judge_call
from vllm_edge.agent.tasks import TASKS
from vllm_edge.bench.engines import llamacpp_chat as lc
from vllm_edge.bench.engines.chat import ContextOverflow
from vllm_edge.common.phone_tools import TOOLS

pytestmark = pytest.mark.slow

MAX_TOKENS = 64  # room for a whole call; SmolLM2 pads it with spaces
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def gguf():
    need_llama_cpp()
    return default_gguf()


@pytest.fixture(scope="module")
def required(gguf):
    chat = lc.llamacpp_chat(gguf, max_tokens=MAX_TOKENS, tool_choice="required")
    yield chat
    chat.close()


def first_turn(task: str, variant: str = "base") -> list[dict]:
    t = TASKS[task]
    screen = uitree.parse(t.make_device(variant).dump_ui()).text()
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Task: {t.goal}\n\nCurrent screen:\n{screen}"}]


def called(_tool: str, **args) -> dict:
    """An assistant turn with one call, as the loop keeps it (arguments as a JSON string)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": _tool, "arguments": json.dumps(args)}}]}


def accepts(llm, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets ``text`` through, then the end of the reply."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert smpl, "llama.cpp rejected the grammar"
    try:
        eos = llm.token_eos()
        for tok in [*llm.tokenize(text.encode(), add_bos=False, special=False), eos]:
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(tok, 0.0, 0.0))
            arr = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
            if math.isinf(data[0].logit):
                return False
            if tok != eos:
                llama_cpp.llama_sampler_accept(smpl, tok)
        return True
    finally:
        llama_cpp.llama_sampler_free(smpl)


CALL = '<tool_call>\n{"name": "tap", "arguments": {"index": 3}}\n</tool_call>'
COMPACT = '<tool_call>{"name": "swipe", "arguments": {"direction": "up"}}</tool_call>'


@pytest.mark.parametrize("text,required_ok,auto_ok", [
    (CALL, True, True),
    (COMPACT, True, True),
    (CALL + COMPACT, True, True),  # parallel calls, as vLLM allows them unless told otherwise
    ('<tool_call>{"name": "task_complete", "arguments": {"summary": "a \\"b\\""}}</tool_call>', True, True),
    ("I will tap the switch.", False, True),
    ("Sure. " + CALL + " Done.", False, True),  # auto: text around a call is free
    ("half a trigger: <tool_cal", False, True),
    ('<tool_call>\n{"name": "tap", "arguments": {"index": "3"}}\n</tool_call>', False, False),  # schema
    ('<tool_call>\n{"name": "swipe", "arguments": {"direction": "sideways"}}\n</tool_call>', False, False),
    ('<tool_call>\n{"name": "fly", "arguments": {}}\n</tool_call>', False, False),  # no such tool
    ('<tool_call>\n{"name": "tap", "arguments": {"index": 3, "x": 1}}\n</tool_call>', False, False),
    ('<tool_call>\n{"name": "type_text", "arguments": {"text": "a\nb"}}\n</tool_call>', False, False),
    ("text <tool_call> more text", False, False),  # an opened call must be a call
    ('<tool_call>\n{"name": "tap", "arguments": {"index": 3}}', False, False),  # unfinished
])
def test_the_grammar_llama_cpp_compiles(required, text, required_ok, auto_ok):
    assert accepts(required.llm, lc.tool_grammar(TOOLS, "required"), text) is required_ok
    assert accepts(required.llm, lc.tool_grammar(TOOLS, "auto"), text) is auto_ok


def test_constrained_turns_are_calls_that_satisfy_their_schema(required):
    jsonschema = pytest.importorskip("jsonschema")
    history = first_turn("wifi_on")
    convs = [first_turn("add_alarm_730am"), first_turn("airplane_on", "renamed"), history,
             # a second turn: the reply to a call, as the loop sends it back
             history + [called("open_app", name="Settings"),
                        {"role": "tool", "tool_call_id": "a", "content": "Opened Settings."}]]
    calls = 0
    for msgs in convs:
        reply = required(msgs, TOOLS)
        if reply["finish_reason"] == "length":
            assert judge_call(reply, TOOLS) == "cut_at_max_tokens"
            continue
        assert reply["finish_reason"] == "tool_calls" and reply["tool_calls"], reply
        for tc in reply["tool_calls"]:
            fn = tc["function"]
            jsonschema.validate(json.loads(fn["arguments"]), PARAMS[fn["name"]])
            calls += 1
        assert judge_call(reply, TOOLS) == "valid"
    assert calls >= 3, f"only {calls} finished calls in {len(convs)} turns of {MAX_TOKENS} tokens"
    assert required.describe()["grammar_s"] is not None


def test_unconstrained_returns_a_reply(gguf):
    chat = lc.llamacpp_chat(gguf, max_tokens=16, tool_choice="auto", n_threads=1)
    try:
        reply = chat(first_turn("wifi_off"), TOOLS)
    finally:
        chat.close()
    assert reply["role"] == "assistant" and reply["finish_reason"] in ("stop", "length", "tool_calls")
    assert reply.get("tool_calls") or reply["content"]
    assert chat.describe()["n_threads"] == 1


def test_a_prompt_over_the_context_is_a_context_overflow(gguf):
    chat = lc.llamacpp_chat(gguf, max_tokens=MAX_TOKENS, tool_choice="required", n_ctx=512)
    try:
        with pytest.raises(ContextOverflow, match="maximum context length is 512 tokens"):
            chat(first_turn("wifi_on"), TOOLS)
    finally:
        chat.close()


def test_llama_cpp_reads_the_prompt_vllm_renders(required, default_model_dir):
    """vLLM's own message parsing and template call, and its tokenizer, against ours."""
    from transformers import AutoTokenizer
    from vllm.config import ModelConfig
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import safe_apply_chat_template

    msgs = first_turn("add_alarm_730am") + [
        called("type_text", text="7:30 é"),
        {"role": "tool", "tool_call_id": "a", "content": "Typed."},
        {"role": "assistant", "content": "hmm <tool_call> {not json"},
        {"role": "user", "content": "You did not call a tool."}]
    config = ModelConfig(model=str(default_model_dir))
    conversation, _, _ = parse_chat_messages(msgs, config, "string")
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    want = safe_apply_chat_template(config, tokenizer, conversation, tools=TOOLS,
                                    chat_template=required.template, tokenize=False,
                                    add_generation_prompt=True)
    got = lc.render(required.template, msgs, TOOLS)
    assert got == want
    assert (required.llm.tokenize(got.encode(), add_bos=False, special=True)
            == tokenizer(want, add_special_tokens=False)["input_ids"])


def test_cli_runs_the_suite_on_llama_cpp(gguf, tmp_path, capsys):
    from vllm_edge.cli import main
    from vllm_edge.models.gguf_import import sha256_file

    out = tmp_path / "agent.json"
    rc = main(["agent", "run", "--engine", "llamacpp", "--gguf", str(gguf), "--tasks", "wifi_already_on",
               "--variants", "base", "--constrained", "--max-steps", "2", "--max-tokens", str(MAX_TOKENS),
               "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    assert "wifi_already_on/base #1" in capsys.readouterr().out
    data = json.loads(out.read_text())
    import llama_cpp

    cfg = data["config"]
    assert cfg["engine"] == "llamacpp" and cfg["tool_choice"] == "required" and cfg["constrained"] is True
    assert cfg["gguf"] == str(gguf) and cfg["gguf_sha256"] == sha256_file(gguf)
    assert cfg["llama_cpp_version"] == llama_cpp.__version__ and cfg["n_threads"] >= 1
    assert cfg["chat_template"].endswith("smollm2_tools.jinja") and cfg["grammar_s"] is not None
    assert data["provenance"]["gguf_sha256"] == cfg["gguf_sha256"]
    assert data["summary"]["runs"] == 1 and data["summary"]["answered_turns"] >= 1
