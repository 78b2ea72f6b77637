"""`vllm-edge --help` and every `vllm-edge <cmd> [<sub>] --help` import neither torch nor vLLM
and cost well under a second: each runs in a fresh interpreter, as a user types it.

The time checked is the CPU time of the import and the call, not the wall time, so another
job on the host's cores does not fail the test (wall time is reported beside it)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from vllm_edge.cli import build_parser

HEAVY = ("torch", "vllm", "transformers")

PROBE = """
import contextlib, io, json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
{pre}
from vllm_edge.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main({argv!r})
        code = 0
    except SystemExit as exc:
        code = exc.code
print(json.dumps({{"code": code, "s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "usage": "usage:" in out.getvalue(),
                  "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand the parser knows, walked from the parser itself."""
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += command_paths(sub, (*prefix, name))
    return paths


PATHS = command_paths(build_parser())


def probe(argv: list[str], pre: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY, pre=pre)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_walk_finds_every_command():
    names = {p for p in PATHS if p}
    for expected in [("doctor",), ("run",), ("serve",), ("quantize",), ("models", "build-vlm"),
                     ("models", "export-gguf"), ("bench", "speed"), ("bench", "llamacpp"),
                     ("bench", "llamacpp-fidelity"), ("bench", "int4-micro"), ("bench", "init-memory"),
                     ("agent", "run"), ("grid",), ("fidelity",), ("report",), ("compare",),
                     ("bandwidth",)]:
        assert expected in names, expected
    assert len(PATHS) >= 30


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "vllm-edge")
def test_help_is_light(path):
    r = probe([*path, "--help"])
    assert r["code"] == 0 and r["usage"]
    assert r["heavy"] == [], f"`vllm-edge {' '.join(path)} --help` imported {r['heavy']}"
    took = f"{r['cpu_s']:.2f} s CPU ({r['s']:.2f} s wall)"
    assert r["cpu_s"] < 1.0, f"`vllm-edge {' '.join(path)} --help` took {took}"


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a module that imports torch at the top is reported."""
    r = probe(["doctor", "--help"], pre="import vllm_edge.bench.fidelity.engine")
    assert "torch" in r["heavy"]
