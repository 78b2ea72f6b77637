"""Ctrl-C stops a streamed answer within a second, every time, and keeps the chat, even when
the chat was started with SIGINT ignored (as a background job of a script or CI is). A real
terminal (a pty that is the chat's controlling terminal) and a real streaming HTTP server on
loopback; no engine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMES = 20


def _read_until(fd: int, pattern: str, timeout: float, seen: list[str]) -> float:
    """Reads the terminal until ``pattern`` matches what arrived since the call; returns when."""
    import select

    start = len("".join(seen))
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:
                break
        if re.search(pattern, "".join(seen)[start:]):
            return time.time()
    raise AssertionError(f"no {pattern!r} within {timeout} s; the terminal showed:\n{''.join(seen)[-2000:]}")


@pytest.fixture
def stream_server():
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/support/slow_stream_server.py")],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield f"http://127.0.0.1:{proc.stdout.readline().strip()}"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sigint", ["ignored", "default"])
def test_ctrl_c_stops_the_answer_within_a_second_every_time(stream_server, sigint):
    import fcntl
    import termios

    master, slave = os.openpty()

    def terminal():  # a login shell's job: the pty is the controlling terminal, Ctrl-C is SIGINT
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if sigint == "ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    code = ("from vllm_edge.serving import chat; "
            f"chat.repl({stream_server!r}, 'm', chat.Settings(), banner='ready')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave,
                            close_fds=True, start_new_session=True, preexec_fn=terminal)
    os.close(slave)
    seen: list[str] = []
    waits = []
    try:
        _read_until(master, r">>> $", 60, seen)
        for i in range(TIMES):
            os.write(master, f"tell me a long story {i}\n".encode())
            _read_until(master, r"word3 ", 30, seen)  # the answer is streaming
            sent = time.time()
            os.write(master, b"\x03")
            stopped = _read_until(master, r"\(stopped\)[\s\S]*>>> $", 5, seen)
            waits.append(stopped - sent)
        os.write(master, b"\x04")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert len(waits) == TIMES and max(waits) < 1.0, waits
