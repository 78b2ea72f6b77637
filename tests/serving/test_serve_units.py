"""The parts of `serve` and `bench soak` that need no engine."""

from __future__ import annotations

import json
import socket

import pytest

from vllm_edge.bench import soak
from vllm_edge.serving import serve


def test_busy_port_is_a_clear_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(serve.ServeError, match=rf"port {port} on 127.0.0.1 is already in use"):
            serve.bind("127.0.0.1", port)
    sock = serve.bind("127.0.0.1", port)  # free again
    sock.close()


def test_engine_kwargs_become_vllm_flags_vllm_accepts():
    flags = serve.vllm_flags({"model": "/m", "max_model_len": 2048, "enforce_eager": False,
                              "enable_prefix_caching": True, "kv_cache_memory_bytes": 123,
                              "worker_extension_cls": "a.B", "quantization": None})
    assert flags == ["--model", "/m", "--max-model-len", "2048", "--no-enforce-eager",
                     "--enable-prefix-caching", "--kv-cache-memory-bytes", "123",
                     "--worker-extension-cls", "a.B"]
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(flags)
    assert (args.model, args.max_model_len, args.enforce_eager, args.enable_prefix_caching,
            args.kv_cache_memory_bytes, args.worker_extension_cls) == ("/m", 2048, False, True, 123, "a.B")


def test_a_config_becomes_a_json_flag_vllm_parses(default_model_dir):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_edge.runtime.speculative import NGRAM

    assert serve.vllm_flags({"speculative_config": {"method": "ngram"}}) == [
        "--speculative-config", '{"method": "ngram"}']
    p = serve.plan("default", port=8123, enforce_eager=True, speculative="ngram")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(p.argv)
    assert args.speculative_config == NGRAM
    assert any(line.startswith("speculative_config=") for line in p.lines)
    assert "speculative_config" not in serve.plan("default", port=8123).describe["engine"]["engine_args"]


def test_speculation_sends_min_p_0_over_a_min_p_default(default_model_dir, monkeypatch):
    from vllm_edge.serving import sampling

    monkeypatch.setattr(sampling, "for_model",
                        lambda model, path: sampling.Defaults(dict(sampling.FALLBACK), "test"))
    plain = serve.plan("default", port=8123)
    on = serve.plan("default", port=8123, speculative="ngram")

    def override(p):
        return json.loads(p.argv[p.argv.index("--override-generation-config") + 1])

    assert override(plain) == sampling.FALLBACK
    assert override(on) == {**sampling.FALLBACK, "min_p": 0.0}
    assert any("min_p 0 instead of 0.05" in line for line in on.lines)
    assert on.describe["sampling_defaults"]["min_p"] == 0.0


def test_plan_for_the_default_model(default_model_dir):
    p = serve.plan("default", port=8123, enforce_eager=True)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(p.argv)
    assert args.served_model_name == ["smollm2-135m", "default"]
    assert args.tool_call_parser == "hermes" and args.enable_auto_tool_choice
    assert args.tool_strict_level == "parameter"
    assert args.chat_template == str(serve.TOOL_TEMPLATES["smollm2-135m"])
    assert args.kv_cache_memory_bytes == p.describe["engine"]["engine_args"]["kv_cache_memory_bytes"]
    assert (args.host, args.port, args.enforce_eager) == ("127.0.0.1", 8123, True)
    assert p.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert any(line.startswith("weight path:") for line in p.lines)
    # a user's vLLM flag after `--` wins
    p2 = serve.plan("default", extra=["--max-num-seqs", "2"])
    assert make_arg_parser(FlexibleArgumentParser()).parse_args(p2.argv).max_num_seqs == 2


def test_the_engine_core_in_the_servers_process_is_asked_for_and_said(default_model_dir):
    assert not serve.plan("default", port=8123).core_in_process  # `serve` keeps vLLM's layout
    p = serve.plan("default", port=8123, core_in_process=True, max_num_batched_tokens=512)
    assert p.core_in_process and p.describe["core_in_process"]
    assert p.argv[p.argv.index("--max-num-batched-tokens") + 1] == "512"
    assert any(line.startswith("engine core: in this process") for line in p.lines)
    with pytest.raises(serve.ServeError, match="without --multiprocess"):
        serve.plan("default", port=8123, core_in_process=True, multiprocess=True)


def test_tool_parser_choice_for_other_models(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{{ messages }} <tool_call>{{ x }}</tool_call>")
    assert serve.choose_tools(None, tmp_path, None, None)[0] == "hermes"
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    parser, _, why = serve.choose_tools(None, tmp_path, None, None)
    assert parser is None and "--tool-call-parser" in why
    assert serve.choose_tools(None, tmp_path, "llama3_json", None)[0] == "llama3_json"
    assert serve.choose_tools("smollm2-135m", tmp_path, "none", None)[0] is None


def test_tool_template_matches_the_model_without_tools(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    ours = serve.TOOL_TEMPLATES["smollm2-135m"].read_text()
    for msgs in ([{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "yo"}, {"role": "user", "content": "and?"}]):
        assert (tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                           chat_template=ours))


def test_tool_template_renders_tools_calls_and_results(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True,
                                   chat_template=serve.TOOL_TEMPLATES["smollm2-135m"].read_text())
    listed = text.split("<tools>\n")[1].split("</tools>")[0]
    assert json.loads(listed)["name"] == "get_weather"
    call = text.split("<tool_call>\n")[2].split("\n</tool_call>")[0]  # [1] is the instruction
    assert json.loads(call) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_soak_refuses_non_loopback():
    assert soak.require_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert soak.require_loopback("http://localhost:8000")
    with pytest.raises(soak.SoakError, match="loopback only"):
        soak.require_loopback("http://8.8.8.8:8000")


def test_soak_repeat_must_be_positive(tmp_path):
    from support.cli_runner import run_cli

    proc = run_cli("bench", "soak", "--repeat", "0", "--out", str(tmp_path / "s.json"), timeout=120)
    assert proc.returncode == 2 and "--repeat 0: must be at least 1" in proc.stderr
    assert not (tmp_path / "s.json").exists()


def test_tool_outcome_classes():
    def body(calls, content=None):
        return {"choices": [{"message": {"content": content, "tool_calls": calls}}]}

    good = [{"function": {"name": "f", "arguments": '{"a": 1}'}}]
    assert soak._tool_class(body(good), "required") == "ok_tool_calls"
    assert soak._tool_class(body(good), {"type": "function", "function": {"name": "g"}}) == "tool_wrong_function"
    assert soak._tool_class(body([{"function": {"name": "f", "arguments": "{bad"}}]), "auto") \
        == "tool_arguments_invalid_json"
    assert soak._tool_class(body([], "prose"), "auto") == "ok_no_tool_call"
    assert soak._tool_class(body([], "prose"), "required") == "tool_call_missing"
    cut = body([], '<tool_call>\n{"name": "f", "arguments": {"a": "rambl')
    cut["choices"][0]["finish_reason"] = "length"
    assert soak._tool_class(cut, "required") == "tool_call_cut_at_max_tokens"


def test_soak_summary_flags_errors_and_memory():
    o = [soak.Outcome("stream", "ok", 1, 2.0, 200, 0.5, 0.05, 10),
         soak.Outcome("nonstream", "http_500", 2, 1.0, 500),
         soak.Outcome("overlong", "rejected_overlong", 3, 0.1, 400)]
    flat = [(100.0 + i, 1000.0 + (i % 2), 2) for i in range(20)]
    s = soak._summary(o, flat, 100.0, 5, 20)
    assert s["http_5xx"] == 1 and s["errors"] == {"http_500": 1} and not s["passed"]
    assert s["rss_anon"]["flat_within_5pct"] and s["ttft_s"]["p50"] == 0.5
    rising = [(100.0 + i, 1000.0 + 10 * i, 2) for i in range(20)]
    r = soak._summary(o[:1], rising, 100.0, 5, 20)
    assert not r["rss_anon"]["flat_within_5pct"] and r["rss_anon"]["drift_pct"] > 5


def test_sse_lines_split_on_newlines_only():
    # U+2028 and U+0085 are legal unescaped inside JSON strings; splitting on them (as httpx's
    # aiter_lines does) breaks a chunk in two.
    import asyncio
    import json

    from vllm_edge.bench.soak import sse_lines

    chunk = json.dumps({"choices": [{"delta": {"content": "a\u2028b\x85c"}}]}, ensure_ascii=False)
    wire = f"data: {chunk}\r\n\r\ndata: [DONE]\n\n"

    class Resp:
        async def aiter_text(self):
            for i in range(0, len(wire), 7):  # chunk boundaries fall anywhere, \r\n included
                yield wire[i:i + 7]

    async def collect():
        return [line async for line in sse_lines(Resp())]

    data = [line[6:] for line in asyncio.run(collect()) if line.startswith("data: ")]
    assert data == [chunk, "[DONE]"]
    assert json.loads(data[0])["choices"][0]["delta"]["content"] == "a\u2028b\x85c"


def test_plan_for_the_vlm_gates_images(monkeypatch, vlm_int4_dir):
    """An image model gets vLLM's image limit and the image gate, from the environment."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGES", "3")
    p = serve.plan("smolvlm-135m", dtype="auto")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(p.argv)
    assert args.middleware == [serve.GATE]
    assert args.limit_mm_per_prompt == {"image": 3}
    assert p.describe["image_limits"]["max_images"] == 3
    assert any(line.startswith("request gate: ") for line in p.lines)
    assert any(line.startswith("images: data URLs only") for line in p.lines)
    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGES", "-1")
    with pytest.raises(ValueError, match="VLLM_EDGE_MAX_IMAGES='-1': must be at least 1"):
        serve.plan("smolvlm-135m")


def test_plan_for_a_text_model_gates_requests_and_refuses_images(default_model_dir):
    p = serve.plan("default")
    assert p.argv[p.argv.index("--middleware") + 1] == serve.GATE
    assert "--limit-mm-per-prompt" not in p.argv
    assert not p.gate.accepts_images and p.gate.body_cap == 4 << 20
    assert "images: refused with a 400 (the model has no vision encoder)" in p.lines


def test_api_key_reaches_vllm_and_the_gate_but_not_the_description(default_model_dir, monkeypatch):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_edge.serving import gate

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    p = serve.plan("default", api_key="k1", extra=["--max-num-seqs", "3"])
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(p.argv)
    assert args.api_key == ["k1"] and "k1" not in json.dumps(p.describe)
    try:
        serve.configure_gate(p, args)
        assert gate._configured.api_keys == ("k1",) and gate._configured.max_n == 3
    finally:
        gate.configure(None)


@pytest.mark.parametrize("host, key, warned", [("0.0.0.0", None, True), ("0.0.0.0", "k", False),
                                               ("127.0.0.1", None, False), ("::1", None, False)])
def test_open_host_without_a_key_is_warned(default_model_dir, monkeypatch, capsys, host, key, warned):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_edge.serving import gate

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    p = serve.plan("default", host=host, api_key=key)
    try:
        serve.configure_gate(p, make_arg_parser(FlexibleArgumentParser()).parse_args(p.argv))
    finally:
        gate.configure(None)
    assert ("WARNING: listening on" in capsys.readouterr().err) == warned


def test_a_folder_without_a_template_is_a_base_model(tmp_path):
    """A tokenizer_config.json without chat_template is no template (not the text "null");
    each place vLLM reads a template from makes the folder a chat model."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    assert serve.own_template(tmp_path) is None and not serve.has_chat_template(tmp_path)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert serve.has_chat_template(tmp_path)
    (tmp_path / "chat_template.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ y }}"}))
    assert serve.own_template(tmp_path) == "{{ y }}" and serve.has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "chat_template.jinja").write_text("{{ z }}")
    assert serve.own_template(tmp_path) == "{{ z }}" and serve.has_chat_template(tmp_path)


def test_an_unreadable_tokenizer_config_is_left_to_vllm(tmp_path):
    """A tokenizer_config.json that is not JSON is not taken for a base model: the folder goes
    to vLLM's chat as before, which names what is wrong with the file."""
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert serve.has_chat_template(tmp_path)
