"""A first start as a newcomer meets it, in a real terminal (tmux): `run` on an empty
VLLM_EDGE_HOME builds the model and the native ops and starts its keep-alive server, and the
pane shows each phase, live and then with its time, before the chat's prompt; the answer
follows, and the server ends by itself when its keep-alive runs out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from support.cli_runner import run_cli
from support.procs import gone

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]
# the phases an empty home meets before the first answer, in order (serving/startup_phases.py)
PHASES = ["repacking the GGUF's codes", "starting the engine", "loading the weights",
          "building the native op (once per machine)", "allocating the KV cache",
          "starting the API server"]


def test_a_first_start_shows_every_phase_in_the_terminal_before_the_answer(default_model_dir, tmp_path):
    home = tmp_path / "home"  # nothing built, converted or cached for this user yet
    env = {"VLLM_EDGE_HOME": str(home)}
    session = f"vllm-edge-first-{os.getpid()}"
    cmd = " ".join(["env", f"VLLM_EDGE_HOME={home}", sys.executable, "-m", "vllm_edge.cli", "run",
                    "--enforce-eager", "--keep-alive", "10s"])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True)

    def pane() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-200", "-t", session],
                              capture_output=True, text=True).stdout.rstrip()

    live: set[str] = set()  # phases seen on the line redrawn in place while they ran

    def wait(pattern: str, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = pane()
            last = text.splitlines()[-1] if text else ""
            m = re.match(r"\[vllm-edge\] (.+?)\.\.\..* \d+ s$", last)
            if m:
                live.add(m.group(1))
            if re.search(pattern, text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"no {pattern!r} in the pane:\n{pane()}")

    pid = None
    try:
        ready = wait(r">>> *$", 1200)
        before_prompt = ready[: ready.rindex(">>>")]
        shown = re.findall(r"^\[vllm-edge\] (.+): \d+ s$", before_prompt, re.M)
        assert [p for p in shown if p in PHASES] == PHASES, before_prompt
        assert live, "no phase was shown while it ran"
        assert "log:" not in before_prompt  # the log path only on failure
        pid = int(re.search(r"server pid (\d+)", ready).group(1))
        subprocess.run(["tmux", "send-keys", "-t", session, "/set temperature 0", "Enter"], check=True)
        subprocess.run(["tmux", "send-keys", "-t", session, "What is the capital of France?", "Enter"],
                       check=True)
        wait(r"Paris[\s\S]*>>> *$", 600)
        subprocess.run(["tmux", "send-keys", "-t", session, "/bye", "Enter"], check=True)
        deadline = time.time() + 10 + 120
        while time.time() < deadline and not gone(pid):
            time.sleep(1)
        assert gone(pid), "the server outlived its keep-alive"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        run_cli("stop", "--all", env=env, timeout=300)
