"""`bench constrained` without a server: request shapes, verdicts, the metrics parser, the
library probe and the summary."""

from __future__ import annotations

import json

import pytest

from vllm_edge.bench import constrained as c

jsonschema = pytest.importorskip("jsonschema")


def test_cold_warm_and_free_differ_only_in_the_constraint():
    cold = c.request_body("json_schema", "cold", "n1", "p1", "default", 48)
    free = c.request_body("json_schema", "free", "n1", "p1", "default", 48)
    assert cold["response_format"]["json_schema"]["schema"] == c.action_schema("n1")
    assert "response_format" not in free
    assert {k: v for k, v in cold.items() if k != "response_format"} == free
    req = c.request_body("tool_required", "warm", "n1", "p2", "default", 48)
    auto = c.request_body("tool_required", "free", "n1", "p2", "default", 48)
    assert req["tool_choice"] == "required" and auto["tool_choice"] == "auto"
    assert req["tools"] == auto["tools"] and req["tools"][-1]["function"]["name"] == "note_n1"
    # the prompt nonce leads the system turn, so no two requests share a cached prefix beyond it
    assert req["messages"][0]["content"].startswith("[p2] ")
    with pytest.raises(c.ConstrainedBenchError, match="unknown mode"):
        c.request_body("regex", "cold", "n", "p", "m", 8)


def test_each_nonce_is_a_new_schema_and_the_union_is_valid_json_schema():
    a, b = c.action_schema("aa"), c.action_schema("bb")
    assert json.dumps(a) != json.dumps(b)
    jsonschema.Draft202012Validator.check_schema(a)


SAMPLES = [
    {"id": "n1", "action": "tap", "args": {"index": 2}},
    {"id": "n1", "action": "press_key", "args": {"key": "BACK"}},
    {"id": "n1", "action": "press_key", "args": {"key": "back"}},
    {"id": "n2", "action": "tap", "args": {"index": 2}},
    {"id": "n1", "action": "tap", "args": {"index": "2"}},
    {"id": "n1", "action": "fly", "args": {}},
    {"id": "n1", "action": "tap", "args": {"index": 2}, "extra": 1},
    {"id": "n1", "action": "task_complete", "args": {"summary": "done"}},
]


@pytest.mark.parametrize("value", SAMPLES)
def test_the_verdict_agrees_with_jsonschema(value):
    msg = {"role": "assistant", "content": json.dumps(value)}
    ours = c.verdict("json_schema", {}, msg, "stop", "n1") == "valid"
    assert ours == jsonschema.Draft202012Validator(c.action_schema("n1")).is_valid(value)


def test_verdicts_of_prose_cut_output_and_tool_calls():
    assert c.verdict("json_schema", {}, {"content": "Tap Use Wi-Fi."}, "stop", "n") == "invalid_json"
    assert c.verdict("json_schema", {}, {"content": '{"id": "n", "act'}, "length", "n") == "length"
    body = c.request_body("tool_required", "cold", "n", "p", "m", 8)
    call = {"tool_calls": [{"function": {"name": "tap", "arguments": '{"index": 2}'}}]}
    assert c.verdict("tool_required", body, call, "tool_calls", "n") == "valid"
    assert c.verdict("tool_required", body, {"content": "I would tap it."}, "stop", "n") == "missing"


def test_parse_queue_time_sums_every_label_set():
    text = """# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="smollm2-135m"} 2.0
vllm:request_queue_time_seconds_count{engine="0",model_name="smollm2-135m"} 3.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="smollm2-135m"} 0.25
vllm:request_queue_time_seconds_count{engine="1",model_name="smollm2-135m"} 1.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="smollm2-135m"} 0.5
vllm:request_prefill_time_seconds_sum{engine="0",model_name="smollm2-135m"} 9.0
"""
    assert c.parse_queue_time(text) == (0.75, 4)
    assert c.parse_queue_time("") == (0.0, 0)


def test_backend_setting_is_read_from_the_engine_core_config_line():
    line = ("(EngineCore pid=7) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
            "device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='auto', "
            "disable_any_whitespace=False), seed=0")
    assert c.backend_setting("noise\n" + line + "\n") == "auto"
    assert c.backend_setting("no config here") is None


def test_auto_resolves_to_xgrammar_only_when_xgrammar_takes_every_schema():
    pytest.importorskip("vllm")
    ok = c.action_schema("ab12")
    assert c.xgrammar_accepts(ok)
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    assert not c.xgrammar_accepts(bad)
    assert c.resolved_backend("auto", [ok]) == "xgrammar"
    assert c.resolved_backend("auto", [ok, bad]) == "guidance"
    assert c.resolved_backend("guidance", [ok]) == "guidance"
    assert c.resolved_backend(None, [ok]) is None and c.resolved_backend("auto", []) == "auto"


def _row(mode, kind, queue, valid=True):
    return {"mode": mode, "kind": kind, "queue_s": queue, "ttft_s": queue + 0.1, "decode_tps": 20.0,
            "verdict": "valid" if valid else "invalid_json"}


def test_summary_estimates_compile_from_cold_minus_warm():
    rows = [_row("json_schema", "first", 0.9), _row("json_schema", "cold", 0.30), _row("json_schema", "cold", 0.34),
            _row("json_schema", "warm", 0.02), _row("json_schema", "warm", 0.04), _row("json_schema", "warm", 0.03),
            _row("json_schema", "free", 0.01, valid=False), _row("json_schema", "free", 0.01, valid=False)]
    s = c.summarize(rows)["json_schema"]
    assert s["cold"]["queue_s_median"] == 0.32 and s["warm"]["queue_s_median"] == 0.03
    assert s["compile_s_estimate"] == 0.29 and s["first_s_estimate"] == 0.87
    assert s["constrained_valid_rate"] == 1.0 and s["free_valid_rate"] == 0.0
    assert s["free"]["verdicts"] == {"invalid_json": 2}
    assert c.summarize(rows)["tool_required"]["compile_s_estimate"] is None


def test_cli_refuses_an_unknown_mode(capsys):
    from vllm_edge.cli import main

    assert main(["bench", "constrained", "--modes", "regex", "--base-url", "http://127.0.0.1:9"]) != 0
    assert "unknown mode 'regex'" in capsys.readouterr().err


def test_the_serve_guide_table_renders_an_artifact(tmp_path):
    from vllm_edge.bench.report import guide_tables

    rows = [_row("json_schema", "first", 0.9), _row("json_schema", "cold", 0.3), _row("json_schema", "warm", 0.02),
            _row("json_schema", "free", 0.01, valid=False)]
    art = {"benchmark": "constrained", "model_root": "/m/smollm2-135m-cpu_int4-g32", "summary": c.summarize(rows),
           "structured_outputs": {"setting": "auto", "json_schema_backend": "xgrammar"}}
    (tmp_path / "constrained").mkdir()
    (tmp_path / "constrained" / "x.json").write_text(json.dumps(art))
    text = guide_tables.render_constrained(tmp_path, tmp_path / "docs" / "serve.md")
    line = next(ln for ln in text.splitlines() if "`json_schema`" in ln)
    assert line.startswith("| vllm | cpu_int4 g32 | `json_schema` | 0.900 s | 0.300 s | 0.020 s | 0.010 s | 0.280 s |")
    assert "| 3/3 (100%) | 0/1 (0%) | auto: xgrammar | unknown commit | [x.json](../constrained/x.json) |" in line


def _lrow(mode: str, kind: str, grammar: float | None, valid: bool = True) -> dict:
    return {"mode": mode, "kind": kind, "grammar_s": grammar, "ttft_s": 0.5, "decode_tps": 80.0,
            "verdict": "valid" if valid else "missing"}


def test_llamacpp_rows_summarize_their_grammar_build_and_render_beside_vllm(tmp_path):
    from vllm_edge.bench.report import guide_tables

    rows = [_lrow("tool_required", "cold", 0.004), _lrow("tool_required", "warm", 0.001),
            _lrow("tool_required", "warm", 0.002), _lrow("tool_required", "free", 0.003, valid=False)]
    s = c.summarize(rows)["tool_required"]
    assert "queue_s_median" not in s["cold"]
    assert s["cold"]["grammar_s_median"] == 0.004 and s["warm"]["grammar_s_median"] == 0.0015
    assert s["compile_s_estimate"] == 0.0025 and s["constrained_valid_rate"] == 1.0
    art = {"benchmark": "constrained", "engine": "llamacpp", "model_root": "/g/smollm2.Q4_K_M.gguf",
           "summary": c.summarize(rows),
           "structured_outputs": {"setting": "llama.cpp GBNF", "json_schema_backend": "llama.cpp GBNF"}}
    (tmp_path / "constrained").mkdir()
    (tmp_path / "constrained" / "l.json").write_text(json.dumps(art))
    line = next(ln for ln in guide_tables.render_constrained(tmp_path, tmp_path / "x.md").splitlines()
                if "`tool_required`" in ln)
    assert line.startswith("| llamacpp | smollm2.Q4_K_M.gguf | `tool_required` | – | 0.004 s | 0.002 s | 0.003 s |")


@pytest.mark.parametrize("argv, message", [
    (["--engine", "llamacpp"], "--engine llamacpp needs --gguf PATH"),
    (["--engine", "llamacpp", "--gguf", "x.gguf"], "--gguf x.gguf: no such file"),
    (["--engine", "llamacpp", "--gguf", "x.gguf", "--base-url", "http://127.0.0.1:9"],
     "--engine llamacpp runs the GGUF in this process: no --base-url"),
    (["--gguf", "x.gguf", "--base-url", "http://127.0.0.1:9"], "are for --engine llamacpp"),
])
def test_cli_refuses_mixed_engine_flags(argv, message, capsys):
    from vllm_edge.cli import main

    assert main(["bench", "constrained", *argv]) != 0
    assert message in capsys.readouterr().err
