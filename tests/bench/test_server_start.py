"""`bench server`'s pieces that need no engine: the memory split of a process tree by role
(on real processes) and the arm syntax."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from vllm_edge.bench import server_start
from vllm_edge.cli.bench.server import parse_arm
from vllm_edge.common.errors import UsageError

HOLD = "import sys, time; b = bytearray({mb} << 20); b[::4096] = b'x' * len(b[::4096]); " \
       "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"


def _spawn(code: str, argv0_tag: str = "") -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, argv0_tag], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_memory_splits_a_real_tree_by_role():
    """A parent holding 40 MB with a child holding 80 MB (an engine stand-in) and one tagged as
    the schema compiler holding 60 MB: the server's size counts the first two only."""
    start = "a{i} = subprocess.Popen([sys.executable, '-c', {code!r}, {tag!r}], stdout=subprocess.PIPE); " \
            "a{i}.stdout.readline(); "
    kids = ("import subprocess, sys, time; "
            + start.format(i=0, code=HOLD.format(mb=80), tag="VLLM::EngineCore")
            + start.format(i=1, code=HOLD.format(mb=60), tag="gate_compile")
            + HOLD.format(mb=40))
    root = _spawn(kids)
    try:
        time.sleep(0.2)
        mem = server_start.memory(root.pid)
        roles = {r["role"]: r["rss_anon_mb"] for r in mem["processes"]}
        assert set(roles) == {"api_server", "engine_core", "schema_compiler"}, mem
        assert 40 <= roles["api_server"] < 40 + 30 and 80 <= roles["engine_core"] < 80 + 30, roles
        assert 60 <= roles["schema_compiler"] < 60 + 30, roles
        assert mem["server_processes"] == 2
        assert mem["server_rss_anon_mb"] == pytest.approx(roles["api_server"] + roles["engine_core"], abs=0.2)
    finally:
        for pid in [r["pid"] for r in server_start.memory(root.pid)["processes"]][::-1]:
            subprocess.run(["kill", str(pid)], check=False)
        root.wait(timeout=10)


def test_an_arm_is_a_name_flags_and_environment():
    assert parse_arm("b512:--max-num-batched-tokens 512 VLLM_EDGE_X=1 max_num_seqs=1 priority=speed") == \
        ("b512", {"extra": ["--max-num-batched-tokens", "512"], "env": {"VLLM_EDGE_X": "1"},
                  "options": {"max_num_seqs": 1, "priority": "speed"}})
    assert parse_arm("shipped:") == ("shipped", {"extra": [], "env": {}, "options": {}})
    for bad in ("no colon", ":--flag", "x:'unclosed"):
        with pytest.raises(UsageError, match="--arm"):
            parse_arm(bad)
