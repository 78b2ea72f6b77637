"""Suite summary, report file, the CLI, and the OpenAI adapter against a stub HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from vllm_edge.agent import suite
from vllm_edge.agent.client import openai_chat
from vllm_edge.agent.tasks import select_tasks
from vllm_edge.common.phone_tools import TOOLS


class PerTask:
    """Routes to a fresh scripted agent per run; fails the 'renamed' runs of wifi_off on purpose."""

    def __init__(self, scripted):
        self.scripted, self.agent, self.last = scripted, None, None

    def __call__(self, messages, tools):
        if len(messages) == 2:  # a new run starts
            goal = messages[1]["content"]
            task = "wifi_off" if "Turn off Wi-Fi" in goal else "clock_alarm_tab"
            renamed = "Preferences" in goal
            self.agent = self.scripted(task, {"early_done"} if renamed and task == "wifi_off" else set())
        return self.agent(messages, tools)


def test_run_suite_summary(scripted):
    lines = []
    report = suite.run_suite(PerTask(scripted), select_tasks("wifi_off,clock_alarm_tab"), ["base", "renamed"],
                             repeat=2, max_steps=20, log=lines.append)
    s = report["summary"]
    assert s["runs"] == 8 and s["passed"] == 6
    wifi_off = s["per_task"]["wifi_off"]
    assert {k: wifi_off[k] for k in ("runs", "passed", "failed_variants", "falsely_claimed_done", "goal_reached",
                                     "collateral_runs", "errors", "pass_rate")} == {
        "runs": 4, "passed": 2, "failed_variants": ["renamed"], "falsely_claimed_done": 2, "goal_reached": 2,
        "collateral_runs": 0, "errors": 0, "pass_rate": 0.5}
    # every scripted reply is a schema-valid call, one per step, each timed
    steps = [r["steps"] for r in report["runs"] if r["task"] == "wifi_off"]
    assert wifi_off["answered_turns"] == wifi_off["valid_calls"] == sum(steps)
    assert wifi_off["valid_call_rate"] == 1.0 and wifi_off["call_verdicts"] == {"valid": sum(steps)}
    assert wifi_off["mean_steps"] == sum(steps) / 4 and wifi_off["s_per_turn"] >= 0
    assert s["answered_turns"] == sum(r["steps"] for r in report["runs"]) and s["valid_call_rate"] == 1.0
    assert all(len(r["turns"]) == r["answered_turns"] == r["steps"] for r in report["runs"])
    assert s["per_task"]["clock_alarm_tab"]["pass_rate"] == 1.0
    assert s["falsely_claimed_done"] == 2 and s["warnings"] == []
    assert lines[0].startswith("PASS wifi_off/base #1 (") and " valid calls, " in lines[0]
    assert lines[2].startswith("fail wifi_off/renamed #1 (1 steps") and "falsely claimed done" in lines[2]
    text = suite.format_summary(s)
    assert text[0] == "wifi_off: 2/4 passed (50%); failed variants: renamed"
    assert text[1] == "clock_alarm_tab: 4/4 passed (100%)"
    assert "falsely claimed done: 2" in text[2]
    assert len(report["runs"]) == 8 and report["runs"][2]["falsely_claimed_done"] is True


def test_fewer_than_three_runs_warns(scripted):
    report = suite.run_suite(PerTask(scripted), select_tasks("clock_alarm_tab"), ["base", "decoy"], log=None)
    assert report["summary"]["warnings"] == [
        "clock_alarm_tab: only 2 run(s); fewer than 3 runs per task make the pass rate noise "
        "(add variants or --repeat)"]
    assert suite.format_summary(report["summary"])[-1].startswith("warning: clock_alarm_tab: only 2 run(s)")


def test_report_file_has_provenance(tmp_path, scripted):
    report = suite.run_suite(PerTask(scripted), select_tasks("clock_alarm_tab"), ["base"], log=None)
    out = tmp_path / "r" / "agent.json"
    suite.write_report(out, report, extra_provenance={"served_model": "m"})
    data = json.loads(out.read_text())
    assert data["kind"] == "agent_suite"
    assert data["provenance"]["served_model"] == "m" and "versions" in data["provenance"]
    assert data["summary"]["passed"] == 1 and data["runs"][0]["task"] == "clock_alarm_tab"
    assert not list(out.parent.glob(".*.tmp"))


class _Stub(BaseHTTPRequestHandler):
    requests: list[dict] = []
    reply: dict = {}

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body})
        payload = json.dumps({
            "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": type(self).reply}],
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_server():
    _Stub.requests = []
    srv = HTTPServer(("127.0.0.1", 0), _Stub)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_openai_chat_adapter(stub_server):
    _Stub.reply = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "tap", "arguments": '{"index": 2}'}}]}
    chat = openai_chat(stub_server, "edge-model", temperature=0.0, max_tokens=64, seed=7)
    msg = chat([{"role": "user", "content": "hi"}], TOOLS)
    assert msg == {"role": "assistant", "content": None, "finish_reason": "tool_calls", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "tap", "arguments": '{"index": 2}'}}]}
    req = _Stub.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["body"]["model"] == "edge-model" and req["body"]["tools"] == TOOLS
    assert req["body"]["temperature"] == 0.0 and req["body"]["max_tokens"] == 64 and req["body"]["seed"] == 7


def test_cli_agent_run_end_to_end(stub_server, tmp_path, capsys):
    from vllm_edge.cli import main

    _Stub.reply = {"role": "assistant", "content": '{"name": "task_complete", "arguments": {"summary": "ok"}}'}
    out = tmp_path / "agent.json"
    rc = main(["agent", "run", "--base-url", stub_server, "--model", "m", "--tasks", "wifi_already_on,wifi_on",
               "--variants", "base,decoy", "--repeat", "1", "--max-steps", "3", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "PASS wifi_already_on/base #1" in text and "fail wifi_on/base #1" in text
    assert "wifi_on: 0/2 passed (0%); failed variants: base, decoy" in text
    assert "warning: wifi_on: only 2 run(s)" in text
    data = json.loads(out.read_text())
    assert data["config"]["model"] == "m" and data["summary"]["falsely_claimed_done"] == 2
    assert data["runs"][2]["recovery_kinds"] == {"text_tool_call": 1}


def test_cli_rejects_unknown_task_and_reports_chat_errors(capsys, tmp_path):
    from vllm_edge.cli import main

    assert main(["agent", "run", "--base-url", "http://x/v1", "--model", "m", "--tasks", "fly"]) == 2
    assert "unknown task" in capsys.readouterr().err
    rc = main(["agent", "run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--tasks", "wifi_on",
               "--variants", "base", "--out", ""])
    assert rc == 1
    assert "errors (chat or device, not model failures): 1 run(s)" in capsys.readouterr().out


# --- valid calls, time per turn, the constrained mode -----------------------------------

def _reply(name, arguments):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "t", "type": "function", "function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize("reply,verdict", [
    (_reply("tap", '{"index": 2}'), "valid"),
    (_reply("swipe", '{"direction": "up"}'), "valid"),
    (_reply("tap", '{"index": "2"}'), "schema_invalid"),  # the loop would coerce it; the schema says integer
    (_reply("swipe", '{"direction": "sideways"}'), "schema_invalid"),
    (_reply("tap", "{}"), "schema_invalid"),
    (_reply("tap", "{'index': 2}"), "invalid_json"),
    (_reply("Tap", '{"index": 2}'), "unknown_tool"),
    ({"role": "assistant", "content": '<tool_call>{"name": "tap", "arguments": {"index": 2}}</tool_call>'},
     "no_tool_call"),  # a call written as text is recoverable, but it is not what the server returned as one
    (None, "no_tool_call"),
    ({"role": "assistant", "content": '<tool_call>{"name": "type_text", "arguments": {"text": "aaaa',
      "finish_reason": "length"}, "cut_at_max_tokens"),
])
def test_judge_call(reply, verdict):
    assert suite.judge_call(reply, TOOLS) == verdict


def test_metered_chat_counts_refusals_apart():
    from vllm_edge.bench.engines.chat import ContextOverflow

    replies = iter([ContextOverflow("maximum context length"), _reply("tap", '{"index": 0}'),
                    {"role": "assistant", "content": "I will tap Settings."}])

    def chat(messages, tools):
        r = next(replies)
        if isinstance(r, Exception):
            raise r
        return r

    metered = suite.MeteredChat(chat)
    with pytest.raises(ContextOverflow):
        metered([], TOOLS)
    metered([], TOOLS)
    metered([], TOOLS)
    rec = metered.record()
    assert rec["refused_overlong"] == 1 and rec["answered_turns"] == 2 and rec["valid_calls"] == 1
    assert [t["call"] for t in rec["turns"]] == ["valid", "no_tool_call"] and rec["valid_call_rate"] == 0.5


def test_openai_chat_sends_the_tool_choice(stub_server):
    _Stub.reply = _reply("tap", '{"index": 1}')
    openai_chat(stub_server, "m", tool_choice="required")([{"role": "user", "content": "hi"}], TOOLS)
    openai_chat(stub_server, "m")([{"role": "user", "content": "hi"}], TOOLS)
    assert [r["body"]["tool_choice"] for r in _Stub.requests] == ["required", "auto"]
    with pytest.raises(ValueError, match="tool_choice must be one of auto, required"):
        openai_chat(stub_server, "m", tool_choice="none")


def test_cli_constrained_run_records_the_mode_and_the_calls(stub_server, tmp_path, capsys):
    from vllm_edge.cli import main

    _Stub.reply = _reply("task_complete", '{"summary": "Wi-Fi was already on."}')
    out = tmp_path / "agent.json"
    rc = main(["agent", "run", "--base-url", stub_server, "--model", "m", "--tasks", "wifi_already_on",
               "--variants", "base", "--constrained", "--max-steps", "3", "--out", str(out)])
    assert rc == 0
    assert all(r["body"]["tool_choice"] == "required" for r in _Stub.requests)
    text = capsys.readouterr().out
    assert "PASS wifi_already_on/base #1 (1 steps, 0 no-op, 0 self-undo, 0 recovered, 1/1 valid calls" in text
    assert "valid calls: 1/1 turns (100%)" in text
    data = json.loads(out.read_text())
    assert data["config"]["constrained"] is True and data["config"]["tool_choice"] == "required"
    assert data["summary"]["valid_call_rate"] == 1.0 and data["runs"][0]["turns"][0]["call"] == "valid"
    assert data["summary"]["per_task"]["wifi_already_on"]["answered_turns"] == 1


def test_prompts_by_name():
    from vllm_edge.agent import prompts
    from vllm_edge.agent.loop import SYSTEM_PROMPT
    from vllm_edge.agent.tasks import TASKS

    assert prompts.prompt("default") == SYSTEM_PROMPT
    ex = prompts.prompt("example")
    assert ex.startswith(SYSTEM_PROMPT) and '<tool_call>{"name": "tap", "arguments": {"index": 2}}</tool_call>' in ex
    # the example shows the format on a task the suite does not score
    assert not any(t.goal in ex for t in TASKS.values()) and "Camera" in ex
    with pytest.raises(ValueError, match="unknown prompt 'long'; one of default, example"):
        prompts.prompt("long")


def test_cli_needs_one_server_source(capsys):
    from vllm_edge.cli import main

    assert main(["agent", "run", "--model", "m", "--tasks", "wifi_on"]) == 2
    assert "give --base-url URL (a running server) or --serve (start one)" in capsys.readouterr().err
    assert main(["agent", "run", "--base-url", "http://127.0.0.1:9/v1", "--tasks", "wifi_on"]) == 2
    assert "the served model name is needed" in capsys.readouterr().err
    assert main(["agent", "run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--prompt", "x"]) == 2


def test_cli_serve_runs_against_the_server_it_started_and_keeps_its_log(monkeypatch, tmp_path, capsys):
    """--serve: the server the run started answers the requests; its log ends gzipped beside
    the artifact, which names it, and nothing else is left behind. (A stub stands in for the
    model server; the engine-backed run is in tests/serving/test_toolcalls_engine.py.)"""
    import gzip

    from vllm_edge.bench import soak
    from vllm_edge.cli import main

    started = {}

    def start_server(args, port, log):
        log.write_text("stub serve " + " ".join(args) + "\n")
        srv = HTTPServer(("127.0.0.1", port), _Stub)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.update(args=args, srv=srv)
        return srv

    def stop_server(srv):
        srv.shutdown()
        srv.server_close()
        started["stopped"] = True
        return 0

    monkeypatch.setattr(soak, "start_server", start_server)
    monkeypatch.setattr(soak, "stop_server", stop_server)
    _Stub.requests = []
    _Stub.reply = _reply("task_complete", '{"summary": "on"}')
    out = tmp_path / "agent" / "run.json"
    rc = main(["agent", "run", "--serve", "--quant", "none", "--tasks", "wifi_already_on", "--variants", "base",
               "--prompt", "example", "--constrained", "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    assert started["args"] == ["default", "--quant", "none"] and started["stopped"]
    assert _Stub.requests and _Stub.requests[0]["body"]["model"] == "default"
    assert _Stub.requests[0]["body"]["messages"][0]["content"].endswith('"Opened the Camera app."}}</tool_call>')
    data = json.loads(out.read_text())
    assert data["config"]["server_log"] == "run.server.log.gz" and data["config"]["prompt"] == "example"
    assert gzip.decompress((out.parent / "run.server.log.gz").read_bytes()).startswith(b"stub serve default")
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.json", "run.server.log.gz"]
