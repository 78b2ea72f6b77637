"""From command to first token: `vllm-edge run --prompt` against a warm keep-alive server,
timed from outside as a user sees it, beside `vllm-edge --help`.

Each pass spawns the CLI in a fresh interpreter and times the first byte of the answer on
its stdout (the client streams it) and the exit. The server is started first (or reused)
and warmed with one answer, so the passes measure the client path: interpreter, our
imports, finding the server, one prefill.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

CLI = [sys.executable, "-m", "vllm_edge.cli"]
PROMPT = "What is the capital of France?"


def _first_byte(argv: list[str], timeout_s: float = 600) -> tuple[float, float, int, str]:
    """(seconds to the first stdout byte, seconds to exit, return code, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = os.read(proc.stdout.fileno(), 1)
    t_first = time.perf_counter() - t0
    rest, err = proc.communicate(timeout=timeout_s)
    return t_first, time.perf_counter() - t0, proc.returncode, (first + rest).decode(errors="replace")


def run(model: str = "default", *, passes: int = 7, keep_alive: str = "10m",
        enforce_eager: bool = False, out: str | None = None) -> dict[str, Any]:
    from vllm_edge.common import atomic, provenance
    from vllm_edge.serving import keepalive

    t = time.time()
    rec, started = keepalive.ensure(model, "auto", keepalive.parse_duration(keep_alive),
                                    {"enforce_eager": enforce_eager})
    ready_s = time.time() - t
    argv = [*CLI, "run", "--model", model, "--prompt", PROMPT, "--keep-alive", keep_alive]
    warm = _first_byte(argv)
    if warm[2] != 0:
        raise RuntimeError(f"`vllm-edge run` failed against the server: {warm[3][-500:]}")
    runs, helps = [], []
    for i in range(passes):  # alternate, so both see the same host
        f, w, rc, text = _first_byte(argv)
        runs.append({"first_token_s": round(f, 3), "wall_s": round(w, 3), "rc": rc,
                     "answer": text.strip()[:80], "loadavg": os.getloadavg()[0]})
        _, hw, hrc, _ = _first_byte([*CLI, "--help"])
        helps.append({"wall_s": round(hw, 3), "rc": hrc})
    torch_free = subprocess.run(
        [sys.executable, "-c", "import sys; from vllm_edge import cli; cli.build_parser(); "
         "import vllm_edge.cli.run, vllm_edge.serving.keepalive, vllm_edge.serving.chat; "
         "print('torch' in sys.modules, 'vllm' in sys.modules)"],
        capture_output=True, text=True).stdout.split()

    def med(rows: list[dict], k: str) -> float:
        return round(statistics.median(r[k] for r in rows), 3)

    result = {
        "what": "wall from spawning `vllm-edge run --prompt` to the first byte of its answer, "
                "with a warm keep-alive server; `vllm-edge --help` wall; medians over passes",
        "model": model, "passes": passes, "prompt": PROMPT,
        "server": {"pid": rec.pid, "port": rec.port, "started_here": started,
                   "ready_s": round(ready_s, 1), "serve_flags": ["--enforce-eager"] if enforce_eager else []},
        "run_first_token_s_median": med(runs, "first_token_s"),
        "run_wall_s_median": med(runs, "wall_s"),
        "help_wall_s_median": med(helps, "wall_s"),
        "client_imports": {"torch": torch_free[:1] == ["True"], "vllm": torch_free[1:2] == ["True"]},
        "targets": {"run_first_token_s": 1.0, "help_wall_s": 1.0},
        "runs": runs, "helps": helps,
        "provenance": provenance.collect(model=None, threads=None),
    }
    result["met"] = {"run_first_token_s": result["run_first_token_s_median"] <= 1.0,
                     "help_wall_s": result["help_wall_s_median"] <= 1.0,
                     "no_torch_in_client": not any(result["client_imports"].values())}
    if out:
        atomic.write_json(out, result)
    return result
