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
