"""`vllm-edge run --keep-alive 0` without -o json: the answer and one summary line on the
terminal; vLLM's own output in a log file under VLLM_EDGE_HOME, named when something fails,
in this process or in a keep-alive server that cannot start."""

from __future__ import annotations

import json
import re

import pytest

from support.cli_runner import run_cli

pytestmark = pytest.mark.slow


def _log(text: str):
    from pathlib import Path

    m = re.search(r"the engine's log: (\S+\.log)", text)
    return Path(m.group(1)) if m else None


def test_quiet_run_prints_the_answer_and_one_line(default_model_dir):
    from vllm_edge import envs

    logs = envs.home() / "logs"
    before = set(logs.glob("run-*.log")) if logs.exists() else set()
    proc = run_cli("run", "--keep-alive", "0", "--enforce-eager", "--max-tokens", "16",
                   timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) <= 4, lines  # the answer (possibly a few lines) and the summary
    assert "Paris" in proc.stdout and lines[-1].startswith("--- ready ")
    assert "INFO" not in proc.stdout + proc.stderr
    (log,) = set(logs.glob("run-*.log")) - before
    text = log.read_text()
    assert "Loading weights took" in text and "plugin loaded" in text  # vLLM's and ours


def test_a_failure_names_the_log(default_model_dir):
    proc = run_cli("run", "--keep-alive", "0", "--enforce-eager", "--max-model-len", "99999",
                   "--prompt", "hi", timeout=900)
    assert proc.returncode == 2
    log = _log(proc.stderr)
    assert log is not None and log.exists(), proc.stderr
    assert "max_model_len" in proc.stderr and "max_model_len" in log.read_text()


def test_a_server_that_cannot_start_names_its_log(default_model_dir):
    proc = run_cli("run", "--enforce-eager", "--max-model-len", "99999", "--prompt", "hi",
                   timeout=900)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    m = re.search(r"the model server exited with \d+ before it was ready; its log: (\S+\.log)",
                  proc.stderr)
    assert m, proc.stderr[-2000:]
    from pathlib import Path

    assert "max_model_len" in Path(m.group(1)).read_text()
    rows = json.loads(run_cli("ps", "-o", "json", timeout=120).stdout)
    assert all(r["log"] != m.group(1) for r in rows)  # no record left behind
