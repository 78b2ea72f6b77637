"""The chat's commands and settings, driven without a server (no turn is sent)."""

from __future__ import annotations

import io

import pytest

from vllm_edge.serving import chat


def _repl(lines):
    feed = iter(lines)

    def read(prompt):
        try:
            item = next(feed)
        except StopIteration:
            raise EOFError from None
        if isinstance(item, BaseException):
            raise item
        return item

    out = io.StringIO()
    s = chat.Settings()
    rc = chat.repl("http://127.0.0.1:9", "m", s, banner="hello", read=read, out=out)
    return rc, out.getvalue(), s


def test_set_show_clear_and_bye():
    rc, text, s = _repl(["/set temperature 0", "/set max_tokens 32", "/set system Be brief.",
                         "/show", "/clear", "", "/bye", "never read"])
    assert rc == 0 and (s.temperature, s.max_tokens, s.system) == (0.0, 32, "Be brief.")
    assert "temperature=0.0 (/set) top_p=server default\nmax_tokens=32 system='Be brief.' (/set) history=0 messages" in text
    assert "(conversation cleared)" in text and text.startswith("hello\n")


def test_an_empty_system_message_is_sent_as_an_empty_turn_and_none_as_no_turn():
    user = [{"role": "user", "content": "hi"}]
    assert chat.turn(user, chat.Settings(system="")) == [{"role": "system", "content": ""}, *user]
    assert chat.turn(user, chat.Settings(system=None)) == user


@pytest.mark.parametrize("line, needle", [("/set speed 3", "/set speed: unknown"),
                                          ("/set max_tokens lots", "expected int"),
                                          ("/set max_tokens 0", "out of range"),
                                          ("/set temperature -1", "out of range"),
                                          ("/help", "commands:")])
def test_bad_commands_are_answered_and_the_chat_goes_on(line, needle):
    rc, text, _ = _repl([line])
    assert rc == 0 and needle in text


def test_ctrl_c_at_the_prompt_keeps_the_session_and_ctrl_d_leaves():
    rc, text, _ = _repl([KeyboardInterrupt(), "/show"])
    assert rc == 0 and "(Ctrl-D or /bye to leave)" in text and "temperature=" in text


def test_a_lost_server_is_reported_and_the_chat_goes_on():
    rc, text, _ = _repl(["hello?", "/show"])
    assert rc == 0 and "error: lost the model server at http://127.0.0.1:9" in text
    assert "temperature=" in text


def test_show_names_where_each_sampling_value_comes_from():
    s = chat.Settings(server={"temperature": 0.2, "top_p": 0.9}, server_source="the model card")
    assert s.sampling() == {}  # nothing set: the request carries none, the server's apply
    assert s.show() == ("temperature=0.2 (server default) top_p=0.9 (server default)\n"
                        "server defaults from: the model card")
    s.set("temperature", "0")
    assert s.sampling() == {"temperature": 0.0}
    assert s.show().startswith("temperature=0.0 (/set) top_p=0.9 (server default)")


def _sse_server(chunks):
    """A loopback server that answers any POST with ``chunks`` as server-sent events and keeps
    what it was sent."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in chunks:
                self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_a_base_model_prompt_is_streamed_as_a_plain_completion():
    chunks = [{"choices": [{"index": 0, "text": " Paris", "finish_reason": None}]},
              {"choices": [{"index": 0, "text": ".", "finish_reason": "length"}]},
              {"choices": [], "usage": {"completion_tokens": 2}}]
    server, seen = _sse_server(chunks)
    try:
        out = io.StringIO()
        settings = chat.Settings(temperature=0.0, max_tokens=2, system="ignored for a base model")
        ans = chat.stream_completion(f"http://127.0.0.1:{server.server_port}", "m",
                                     "The capital of France is", settings, out)
    finally:
        server.shutdown()
    assert out.getvalue() == ans.text == "Paris."
    assert ans.completion_tokens == 2 and ans.finish_reason == "length"
    path, body = seen[0]
    assert path == "/v1/completions" and body["prompt"] == "The capital of France is"
    assert "messages" not in body and body["max_tokens"] == 2 and body["temperature"] == 0.0
