"""keepalive without a server: durations, model identity, stale records cleaned."""

from __future__ import annotations

import json
import subprocess

import pytest

from vllm_edge.serving import keepalive


@pytest.mark.parametrize("text, seconds", [("300", 300), ("30s", 30), ("5m", 300), ("1h", 3600),
                                           ("0", 0), ("1.5m", 90), (" 2m ", 120)])
def test_parse_duration(text, seconds):
    assert keepalive.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "", "-1", "m", "5 minutes"])
def test_bad_duration_is_a_clear_error(text):
    with pytest.raises(keepalive.KeepAliveError, match="--keep-alive"):
        keepalive.parse_duration(text)


def test_model_id_makes_paths_absolute_and_keeps_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    assert keepalive.model_id("default") == "default"
    assert keepalive.model_id("smollm2-135m") == "smollm2-135m"
    assert keepalive.model_id("m") == keepalive.model_id("./m") == str(tmp_path / "m")
    assert keepalive.server_key("default", "auto") != keepalive.server_key("default", "none")


def test_stale_and_unreadable_records_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    d = keepalive.state_dir()
    d.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    rec = keepalive.Record(key="default|auto", model="default", quant="auto", port=9, pid=dead.pid,
                           keep_alive_s=300, log="x")
    (d / "dead.json").write_text(json.dumps(rec.__dict__))
    (d / "garbage.json").write_text("{not json")
    for f in d.glob("*.json"):
        f.chmod(0o600)  # the owner's own records: the only ones it may clean
    assert keepalive.records() == [] and keepalive.find("default|auto") is None
    assert list(d.glob("*.json")) == []
    assert keepalive.stop(rec) is False


def test_a_live_process_that_is_not_our_server_is_not_listed_but_kept(tmp_path, monkeypatch):
    """A starting server is alive and not answering yet: not used, not deleted."""
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    d = keepalive.state_dir()
    d.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        rec = keepalive.Record(key="k|auto", model="k", quant="auto", port=9, pid=sleeper.pid,
                               keep_alive_s=300, log="x")
        (d / "k.json").write_text(json.dumps(rec.__dict__))
        assert keepalive.records() == []
        assert (d / "k.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_parallel_server_is_not_reused_for_one_rank():
    one = keepalive.server_key("default", "auto")
    assert keepalive.server_key("default", "auto", (1, 1)) == one
    assert len({one, keepalive.server_key("default", "auto", (2, 1)),
                keepalive.server_key("default", "auto", (1, 2))}) == 3


def test_the_server_starts_from_the_serving_entry_point_and_its_error_is_shown(tmp_path, monkeypatch):
    """No engine: the model does not exist, so the server process (started from
    serving/keepalive_server, not the CLI) stops at once with its error, which the parent
    reports with the log's tail; no record is left behind."""
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    said = []
    with pytest.raises(keepalive.KeepAliveError, match=r"(?s)exited with 2 before it was ready.*"
                                                        r"no-such-model: no such model directory"):
        keepalive.ensure("no-such-model", "auto", 60, {"max_model_len": 512}, say=said.append)
    assert said and "starting a model server for no-such-model" in said[0]
    assert not list(keepalive.state_dir().glob("*.json"))


def test_the_entry_point_reads_serve_options():
    from vllm_edge.serving import keepalive_server
    from vllm_edge.serving.serve import Parallel

    opts = keepalive_server.options_from_json(json.dumps(
        {"model": "default", "port": 1234, "parallel": {"tensor": 2, "pipeline": 1}}))
    assert opts["parallel"] == Parallel(2, 1) and opts["port"] == 1234
    with pytest.raises(ValueError, match="at least 'model'"):
        keepalive_server.options_from_json("[]")


def _record(pid: int, token: str = "t") -> keepalive.Record:
    return keepalive.Record(key="k|auto", model="k", quant="auto", port=9, pid=pid,
                            keep_alive_s=300, log="x", token=token)


def test_a_record_is_written_owner_only_from_the_start(tmp_path, monkeypatch):
    import os
    import stat

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    d = keepalive._state_dir_ready()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    created = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *a, **kw):
        created.append(mode)
        return real_open(path, flags, mode, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    keepalive.write_record(d / "k.json", _record(os.getpid(), token="secret-token"))
    assert created == [0o600]
    assert stat.S_IMODE((d / "k.json").stat().st_mode) == 0o600
    assert keepalive._read(d / "k.json").token == "secret-token"


def test_a_record_others_can_read_or_write_is_not_trusted(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    d = keepalive._state_dir_ready()
    keepalive.write_record(d / "k.json", _record(os.getpid()))
    for mode in (0o644, 0o620, 0o604):
        (d / "k.json").chmod(mode)
        assert keepalive._read(d / "k.json") is None
        assert keepalive.records() == [] and (d / "k.json").exists()  # not ours to delete
    (d / "k.json").chmod(0o600)
    link = d / "l.json"
    link.symlink_to(d / "k.json")
    assert keepalive._read(link) is None and keepalive._read(d / "k.json") is not None


def test_a_server_that_does_not_answer_the_token_with_its_pid_is_refused(monkeypatch):
    rec = _record(4242)
    seen = []

    def fake_status(port, timeout=2.0, token=""):
        seen.append(token)
        return {"pid": 4243}

    monkeypatch.setattr(keepalive, "status", fake_status)
    with pytest.raises(keepalive.KeepAliveError, match="no longer answers with its token"):
        keepalive.verify(rec)
    assert seen == ["t"]
    monkeypatch.setattr(keepalive, "status", lambda port, timeout=2.0, token="": {"pid": 4242})
    keepalive.verify(rec)


def test_loopback_calls_ignore_proxies_from_the_environment(monkeypatch):
    """HTTP_PROXY once carried loopback status, health and chat calls (and the key) to a proxy."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    hits = []

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"pid": 1, "data": [{"id": "proxy"}]}')

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        proxy = f"http://127.0.0.1:{srv.server_address[1]}"
        for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert keepalive.status(9, timeout=1) is None
        assert keepalive._healthy(9) is False
        with pytest.raises(keepalive.KeepAliveError):
            keepalive.served_name(_record(1))
    finally:
        srv.shutdown()
    assert hits == []


def test_the_server_key_goes_by_environment_and_the_socket_by_fd(tmp_path, monkeypatch):
    """ensure binds the port itself, hands the socket to the child, and puts the token in the
    child's environment, never on its command line."""
    import os
    import socket

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    calls = {}

    class FakeProc:
        pid = os.getpid()
        returncode = 3

        def poll(self):
            return 3

    def fake_popen(cmd, **kw):
        calls["cmd"], calls["kw"] = cmd, kw
        fd = kw["pass_fds"][0]
        s = socket.socket(fileno=os.dup(fd))
        calls["listening"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        calls["addr"] = s.getsockname()
        s.close()
        return FakeProc()

    monkeypatch.setattr(keepalive.subprocess, "Popen", fake_popen)
    with pytest.raises(keepalive.KeepAliveError, match="exited with 3"):
        keepalive.ensure("default", "auto", 60)
    token = calls["kw"]["env"][keepalive.SERVER_KEY_ENV]
    assert len(token) >= 40 and token not in " ".join(calls["cmd"])
    spec = json.loads(calls["cmd"][-1])
    assert spec["sock_fd"] == calls["kw"]["pass_fds"][0] and calls["listening"] == 1
    assert calls["addr"] == ("127.0.0.1", spec["port"])
    assert spec["core_in_process"] is True  # one process: the engine core in the server's
    assert spec["max_num_batched_tokens"] == keepalive.BATCH_TOKENS
    # run's one answer at a time, for every caller that does not say (bench server measures it)
    assert spec["max_num_seqs"] == keepalive.NUM_PARALLEL == 1
    with pytest.raises(keepalive.KeepAliveError):
        keepalive.ensure("default", "auto", 60, ranks=(2, 1))
    assert "core_in_process" not in json.loads(calls["cmd"][-1])  # ranks: vLLM's layout
