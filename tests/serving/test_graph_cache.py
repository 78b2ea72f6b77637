"""The compiled-graph markers of keep-alive servers (serving/graph_cache.py), without an engine:
what the key hangs on, when a marker counts, the build lock and its hand-over to a builder
process, and the builder's CPU priority. The real start, eager then compiled, is in
test_graph_cache_engine.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from vllm_edge.serving import graph_cache

ARGV = ["--model", "/m", "--max-num-seqs", "1", "--host", "127.0.0.1", "--port", "40001"]


@pytest.fixture
def homes(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    return tmp_path


def _aot(tmp_path, name: str, text: str = "graph"):
    f = tmp_path / "vllm" / "torch_compile_cache" / "torch_aot_compile" / name / "rank_0_0" / "model"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    return f


def test_the_key_ignores_what_changes_at_every_start_and_nothing_else(homes, monkeypatch):
    k = graph_cache.key(ARGV, {"OMP_NUM_THREADS": "2"})
    other_port = [*ARGV[:-1], "40002", "--api-key", "secret", "--enforce-eager"]
    assert graph_cache.key(other_port, {"OMP_NUM_THREADS": "2"}) == k
    assert graph_cache.key([*ARGV, "--max-num-batched-tokens", "512"], {"OMP_NUM_THREADS": "2"}) != k
    assert graph_cache.key(ARGV, {"OMP_NUM_THREADS": "1"}) != k
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(homes / "elsewhere"))
    assert graph_cache.key(ARGV, {"OMP_NUM_THREADS": "2"}) != k  # another cache holds no graph


def test_a_marker_counts_while_the_cache_files_it_names_exist(homes):
    k = graph_cache.key(ARGV, {})
    assert graph_cache.built(k) is None
    old = _aot(homes, "a" * 8)
    before = graph_cache.aot_files()
    new = _aot(homes, "b" * 8)
    path = graph_cache.record(k, before, 12.5, ARGV)
    rec = graph_cache.built(k)
    assert rec is not None and rec["files"] == [str(new)] and str(old) not in rec["files"]
    assert "40001" not in rec["argv"]  # the per-start port is not part of what was built
    new.unlink()
    assert graph_cache.built(k) is None  # vLLM's cache was cleared: the next start is eager
    graph_cache.record("other", graph_cache.aot_files(), 1.0, ARGV)
    assert not path.exists()  # a marker that counts for nothing is removed by the next record
    path.write_text("{not json")
    assert graph_cache.built(k) is None


def test_the_build_lock_is_one_builder_at_a_time(homes):
    k = "k1"
    fd = graph_cache.claim(k)
    assert fd is not None
    try:
        assert graph_cache.building(k)
        assert graph_cache.claim(k) is None
        with graph_cache.build_lock(k) as held:
            assert held is False
    finally:
        os.close(fd)
    assert not graph_cache.building(k)
    with graph_cache.build_lock(k) as held:
        assert held is True and graph_cache.building(k)
    assert not graph_cache.building(k)


def test_the_server_hands_the_lock_to_the_builder_it_starts(homes):
    """The server claims the lock, starts a process holding the same descriptor and closes its
    own: the lock stays held until that process ends, with no moment in which it is free."""
    k = "k2"
    fd = graph_cache.claim(k)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], pass_fds=(fd,))
    os.close(fd)
    try:
        assert graph_cache.building(k)
        since = time.time()
        assert graph_cache.wait_all(since - 1, timeout_s=60) == []  # it waited, and no marker came
        assert child.poll() is not None and not graph_cache.building(k)
    finally:
        child.kill()
        child.wait()


def test_wait_all_returns_the_markers_written_meanwhile(homes):
    since = time.time()
    _aot(homes, "c" * 8)
    graph_cache.record("k3", {}, 3.0, ARGV)
    (got,) = graph_cache.wait_all(since, timeout_s=5)
    assert got == {"key": "k3", "build_s": 3.0}
    assert graph_cache.wait_all(time.time() + 60, timeout_s=5) == []


def test_the_builder_runs_only_on_idle_cpu():
    code = ("import os; from vllm_edge.serving import graph_cache as g; how = g.yield_cpu(); "
            "print(how, os.sched_getscheduler(0) == os.SCHED_IDLE, os.nice(0), sep='|')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    how, idle, nice = out.strip().split("|")
    assert (how, idle) == ("SCHED_IDLE", "True") or (how, nice) == ("nice 19", "19"), out


def test_a_builder_that_fails_leaves_no_marker_and_frees_the_lock(homes):
    """A builder is detached (the shell that starts it returns at once); one that cannot build
    (here: no model named) writes its error to its log, leaves no marker and releases the lock."""
    k = "k4"
    fd = graph_cache.claim(k)
    log = homes / "graph.log"
    try:
        assert graph_cache.spawn_builder({"not a model": True}, dict(os.environ), log, fd) == 0
    finally:
        os.close(fd)
    deadline = time.time() + 120
    while graph_cache.building(k) and time.time() < deadline:
        time.sleep(0.2)
    assert not graph_cache.building(k)
    assert "expected a JSON object with at least 'model'" in log.read_text()
    assert graph_cache.built(k) is None and not graph_cache.marker(k).exists()
