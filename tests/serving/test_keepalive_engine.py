"""`run` as a client of a keep-alive server, on the default model (eager), in order:
two `run`s started together start one server; a third reuses it; a pipe gets the answer
alone; the chat works in a real pseudo-terminal (and in tmux when it is installed); `ps`
lists the server and `stop` ends it; a server with a short keep-alive stops by itself."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

from support.cli_runner import run_cli
from support.procs import gone

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "vllm_edge.cli"]
ASK = ["--prompt", "What is the capital of France?", "--enforce-eager", "--keep-alive", "10m"]


def _ps() -> list[dict]:
    proc = run_cli("ps", "-o", "json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [r for r in json.loads(proc.stdout) if r["model"] == "default"]


@pytest.fixture(scope="module")
def first_runs(default_model_dir):
    run_cli("stop", "default", timeout=120)  # nothing of an earlier run in the way
    procs = [subprocess.Popen([*CLI, "run", *ASK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=1800) for p in procs]
    yield [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]
    run_cli("stop", "--all", timeout=300)


def test_two_first_runs_start_one_server(first_runs):
    for rc, out, err in first_runs:
        assert rc == 0, err[-2000:]
        assert "Paris" in out
    starts = [err for _, _, err in first_runs if "starting a model server" in err]
    assert len(starts) == 1, [e[-500:] for _, _, e in first_runs]
    # the phases of the start, each with its time, read from the server's log while waiting
    shown = re.findall(r"\[vllm-edge\] ([a-zA-Z ,()0-9]+): \d+ s\n", starts[0])
    want = ["starting the engine", "loading the weights", "allocating the KV cache", "starting the API server"]
    assert [p for p in shown if p in want] == want, starts[0][-3000:]
    assert "log:" not in starts[0]  # the log path only on failure
    pids = {re.search(r"server pid (\d+)", err).group(1) for _, _, err in first_runs}
    assert len(pids) == 1
    (row,) = _ps()
    assert str(row["pid"]) in pids and row["rss_anon_mb"] > 100
    assert all("over 1 processes" in err for _, _, err in first_runs), first_runs[0][2][-500:]


def test_the_server_is_one_process_and_an_abort_frees_its_engine(first_runs):
    """The engine core runs in the API server's process (serving.inproc_core): the server's
    tree has no engine-core process, and a client that hangs up mid-answer has its request
    aborted in that engine, which then answers the next request."""
    import httpx

    from vllm_edge.common import procmem
    from vllm_edge.serving import keepalive

    (row,) = _ps()
    rows = [(pid, procmem.cmdline(pid)) for pid, _, shared in procmem.tree_rss_anon_kb(row["pid"])
            if not shared]
    server = [(pid, cmd) for pid, cmd in rows if "gate_compile" not in cmd]
    assert [pid for pid, _ in server] == [row["pid"]], rows
    assert "keepalive_server" in server[0][1]
    rec = keepalive.find(keepalive.server_key("default", "auto"))
    # the engine vLLM built runs the keep-alive server's step size, not the server default
    log = open(rec.log).read()
    assert f"max_num_batched_tokens={keepalive.BATCH_TOKENS}." in log
    # it started at the raised collector thresholds and runs at Python's own once ready
    from vllm_edge.runtime import gc_freeze

    held = re.search(r"garbage collector while starting: thresholds \((\d+), (\d+), (\d+)\) while "
                     r"starting \(Python's: \((\d+), (\d+), (\d+)\)\)", log)
    assert held, log[:3000]
    assert tuple(map(int, held.groups()[:3])) == gc_freeze.START_THRESHOLD
    st = keepalive.status(rec.port, token=rec.token)
    assert tuple(st["gc_threshold"]) == tuple(map(int, held.groups()[3:])) != gc_freeze.START_THRESHOLD
    name = keepalive.served_name(rec)
    body = {"model": name, "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 1500, "temperature": 0.8, "stream": True}
    with httpx.stream("POST", rec.url + "/v1/chat/completions", json=body, headers=rec.headers,
                      timeout=300, trust_env=False) as r:
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks >= 5:
                break  # hang up mid-answer

    def running() -> float:
        text = httpx.get(rec.url + "/metrics", headers=rec.headers, timeout=30, trust_env=False).text
        return sum(float(m.group(1)) for m in re.finditer(r"^vllm:num_requests_running\{[^}]*\} (\S+)$",
                                                           text, re.M))

    deadline = time.time() + 60
    while time.time() < deadline and running() > 0:
        time.sleep(0.5)
    assert running() == 0, "the request of a client that hung up still runs"
    r = httpx.post(rec.url + "/v1/chat/completions", headers=rec.headers, timeout=300, trust_env=False,
                   json={"model": name, "max_tokens": 16, "temperature": 0,
                         "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                      {"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]


def test_the_next_run_reuses_it_and_starts_no_engine(first_runs):
    (row,) = _ps()
    t = time.time()
    proc = run_cli("run", *ASK, timeout=600)
    wall = time.time() - t
    assert proc.returncode == 0 and "Paris" in proc.stdout, proc.stderr
    assert f"server pid {row['pid']} on 127.0.0.1:{row['port']} (reused)" in proc.stderr
    assert "starting" not in proc.stderr and wall < 120  # loose: the host is shared
    (again,) = _ps()
    assert again["pid"] == row["pid"]


def test_a_pipe_gets_the_answer_alone(first_runs):
    proc = subprocess.run([*CLI, "run", "--enforce-eager"], input="What is the capital of France?\n",
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout and ">>>" not in proc.stdout and "---" not in proc.stdout
    assert proc.stderr == ""


def test_bench_first_token_reuses_the_server_and_imports_no_torch(first_runs, tmp_path):
    (row,) = _ps()
    out = tmp_path / "first_token.json"
    proc = run_cli("bench", "first-token", "--passes", "2", "--keep-alive", "10m",
                   "--enforce-eager", "--out", str(out), timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: a target missed on a busy host
    r = json.loads(out.read_text())
    assert r["server"]["pid"] == row["pid"] and not r["server"]["started_here"]
    assert r["client_imports"] == {"torch": False, "vllm": False}
    assert len(r["runs"]) == 2 and all(x["rc"] == 0 and "Paris" in x["answer"] for x in r["runs"])
    assert 0 < r["run_first_token_s_median"] <= r["run_wall_s_median"]
    assert r["provenance"]["loadavg"]


def _read_until(fd: int, pattern: str, timeout: float, seen: list[str]) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 4096).decode(errors="replace")
            except OSError:
                break
            seen.append(chunk)
            if re.search(pattern, "".join(seen)):
                return "".join(seen)
    raise AssertionError(f"no {pattern!r} in {''.join(seen)[-2000:]!r}")


def test_the_chat_in_a_terminal(first_runs):
    import fcntl
    import termios

    master, slave = os.openpty()

    def controlling_terminal():  # as a login shell would: Ctrl-C then sends SIGINT
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([*CLI, "run", "--enforce-eager"], stdin=slave, stdout=slave,
                            stderr=slave, close_fds=True, start_new_session=True,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    seen: list[str] = []
    try:
        _read_until(master, r">>> $", 600, seen)
        os.write(master, b"/set temperature 0\n")
        _read_until(master, r"temperature = 0\.0[\s\S]*>>> $", 60, seen)
        os.write(master, b"What is the capital of France?\n")
        text = _read_until(master, r"Paris[\s\S]*>>> $", 600, seen)
        os.write(master, b"And Italy?\n")
        _read_until(master, r"Italy\?[\s\S]+>>> $", 600, seen)
        os.write(master, b"/show\n")  # both exchanges are kept and sent with the next turn
        _read_until(master, r"history=4 messages[\s\S]*>>> $", 60, seen)
        os.write(master, b"Write a very long story about a dragon.\n")
        time.sleep(3)
        os.write(master, b"\x03")  # Ctrl-C stops the answer, not the chat
        text = _read_until(master, r"\(stopped\)[\s\S]*>>> $", 120, seen)
        os.write(master, b"\x04")  # Ctrl-D leaves
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert "vllm-edge chat: default on server pid" in text


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_chat_in_tmux(first_runs, tmp_path):
    session = f"vllm-edge-test-{os.getpid()}"
    cmd = " ".join([*CLI, "run", "--enforce-eager"])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd],
                   check=True)

    def pane() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                              text=True).stdout.rstrip()  # the rows below the prompt are blank

    def wait(pattern: str, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = pane()
            if re.search(pattern, text):
                return text
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} in the pane:\n{pane()}")

    try:
        wait(r">>> *$", 600)
        subprocess.run(["tmux", "send-keys", "-t", session, "/set temperature 0", "Enter"], check=True)
        subprocess.run(["tmux", "send-keys", "-t", session, "What is the capital of France?", "Enter"],
                       check=True)
        wait(r"Paris[\s\S]*>>> *$", 600)
        subprocess.run(["tmux", "send-keys", "-t", session, "/bye", "Enter"], check=True)
        deadline = time.time() + 60
        while time.time() < deadline and subprocess.run(
                ["tmux", "has-session", "-t", session], capture_output=True).returncode == 0:
            time.sleep(0.5)
        assert subprocess.run(["tmux", "has-session", "-t", session],
                              capture_output=True).returncode != 0, "the chat did not exit on /bye"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_stop_ends_the_server(first_runs):
    (row,) = _ps()
    proc = run_cli("stop", "default", timeout=300)
    assert proc.returncode == 0 and f"pid {row['pid']}" in proc.stdout
    assert gone(row["pid"]) and _ps() == []
    assert run_cli("stop", "default", timeout=120).returncode == 1  # nothing left to stop


def test_a_short_keep_alive_stops_by_itself(default_model_dir):
    proc = run_cli("run", "--prompt", "Hi", "--enforce-eager", "--keep-alive", "10s", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pid = int(re.search(r"server pid (\d+)", proc.stderr).group(1))
    deadline = time.time() + 10 + 120
    while time.time() < deadline and not gone(pid):
        time.sleep(1)
    assert gone(pid), "the server outlived its keep-alive"
    assert _ps() == []
