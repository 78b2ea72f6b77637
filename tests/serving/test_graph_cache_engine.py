"""The first start of a keep-alive server on an empty vLLM compile cache, on the real engine:
it answers eager, starts a builder at idle priority outside its process tree and group, the
builder leaves a marker naming the compile-cache files it made (a graph with Inductor's C++
wrapper), and the next start loads that graph instead of compiling."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from support.cli_runner import run_cli

pytestmark = pytest.mark.slow
ASK = ["--prompt", "What is the capital of France?", "--keep-alive", "10m"]


def _builders() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "vllm_edge.serving.keepalive_server" in cmd and '"graph": "build"' in cmd:
                out.append(int(d.name))
    return out


def _ppid(pid: int) -> int:
    return int(re.search(r"^PPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


def test_the_first_start_answers_eager_and_the_next_loads_the_graph_built_beside_it(
        default_model_dir, tmp_path):
    from vllm_edge.serving import graph_cache, keepalive

    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}  # nothing compiled for this server yet
    run_cli("stop", "default", timeout=120)
    since = time.time()
    first = run_cli("run", *ASK, env=env, timeout=1800)
    try:
        assert first.returncode == 0 and "Paris" in first.stdout, first.stderr[-3000:]
        assert "compiled graph: not cached yet" in first.stderr
        assert "compiling the model" not in first.stderr
        rec = keepalive.find(keepalive.server_key("default", "auto"))
        log = open(rec.log).read()
        assert "enforce_eager=True: no compiled graph is cached" in log
        assert "Warming up model for the compilation" not in log  # eager: nothing compiled

        builders = _builders()
        if builders:  # still building: it lives beside the server, not under it
            (pid,) = builders
            assert _ppid(pid) != rec.pid
            assert os.getpgid(pid) not in (pid, os.getpgid(rec.pid))
            assert os.getsid(pid) == os.getsid(rec.pid)  # the autogroup that makes SCHED_IDLE count
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        os.environ.update(env)  # graph_cache reads the same cache root as the server
        try:
            (made,) = graph_cache.wait_all(since, timeout_s=1200)
            marker = graph_cache.built(made["key"])
        finally:
            os.environ.pop("VLLM_CACHE_ROOT")
        assert marker and marker["files"], made
        assert all(f.startswith(env["VLLM_CACHE_ROOT"]) and os.path.isfile(f) for f in marker["files"])
        # the graph was built with Inductor's C++ wrapper (runtime/cpp_wrapper.py): its cached
        # output code holds the wrapper's C++ source, not a Python `call` over the kernels
        outputs = [f.read_text(errors="replace") for f in Path(env["VLLM_CACHE_ROOT"]).rglob("inductor_cache/*/*.py")]
        assert outputs and any("CppWrapperCodeCache" in text for text in outputs), len(outputs)
        glog = re.search(r"compiled graph builder log: (\S+)", log).group(1)
        assert "compiled graph builder: SCHED_IDLE" in open(glog).read()
        assert keepalive.find(keepalive.server_key("default", "auto")).pid == rec.pid  # still serving

        assert run_cli("stop", "default", timeout=300).returncode == 0
        second = run_cli("run", *ASK, env=env, timeout=1800)
        assert second.returncode == 0 and "Paris" in second.stdout, second.stderr[-3000:]
        assert "not cached yet" not in second.stderr
        rec2 = keepalive.find(keepalive.server_key("default", "auto"))
        log2 = open(rec2.log).read()
        assert f"compiled graph: cached for these arguments (marker {graph_cache.root()}" in log2
        assert "enforce_eager=False" in log2
        # the builder's graph loaded (the aot_cache patch says so), nothing compiled or saved again
        assert "so the cached artifact loads" in log2 and "saved AOT compiled function" not in log2
        assert _builders() == []
    finally:
        run_cli("stop", "default", timeout=300)
