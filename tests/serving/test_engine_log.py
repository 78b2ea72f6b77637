"""engine_log: everything written to fds 1 and 2 inside the block lands in the log, the
terminal gets its descriptors back, and old logs are pruned."""

from __future__ import annotations

import os
import subprocess
import sys

from vllm_edge.serving import engine_log

SCRIPT = """
import os, subprocess, sys
from pathlib import Path
from vllm_edge.serving import engine_log
log = Path(sys.argv[1])
try:
    with engine_log.redirected(log):
        print("from python stdout")
        print("from python stderr", file=sys.stderr)
        os.write(1, b"from fd 1\\n")
        subprocess.run(["sh", "-c", "echo from a child; echo child err >&2"], check=True)
        if sys.argv[2] == "fail":
            raise SystemExit(3)
finally:
    print("after")
"""


def _run(tmp_path, mode):
    log = tmp_path / "run.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log), mode], capture_output=True,
                          text=True, timeout=120)
    return proc, log


def test_fd_level_output_goes_to_the_log_and_the_fds_come_back(tmp_path):
    proc, log = _run(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    for needle in ("from python stdout", "from python stderr", "from fd 1", "from a child", "child err"):
        assert needle in text
    assert proc.stdout == "after\n" and proc.stderr == ""


def test_an_exception_names_the_log_on_the_terminal(tmp_path):
    proc, log = _run(tmp_path, "fail")
    assert proc.returncode == 3
    assert proc.stderr == f"[vllm-edge] the engine's log: {log}\n" and proc.stdout == "after\n"
    assert "from a child" in log.read_text()


def test_old_logs_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(engine_log.KEEP + 5):
        p = logs / f"run-old-{i:03d}.log"
        p.write_text("x")
        os.utime(p, (1000 + i, 1000 + i))
    new = engine_log.new_path()
    assert new.parent == logs and not new.exists()
    kept = sorted(p.name for p in logs.glob("run-*.log"))
    assert len(kept) == engine_log.KEEP - 1 and kept[0] == "run-old-006.log"
