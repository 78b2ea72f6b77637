"""The llama.cpp arm prints bench speed's metric JSON as its last stdout line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_edge.bench.llamacpp import arm as llamacpp_arm
from vllm_edge.common.jsonline import last_json_line
from vllm_edge.models import store

LLAMA_CPP_REASON = "llama-cpp-python is not installed (pip install 'vllm-edge[baselines]')"


def _arm(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_edge.cli", "bench", "llamacpp", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_bad_arguments_exit_2_before_loading(tmp_path):
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_REASON)
    gguf = str(store.source_gguf(store.resolve_key("default")))
    proc = _arm("--gguf", gguf, "--tg-tokens", "1")
    assert proc.returncode == 2 and "--tg-tokens must be at least 2" in proc.stderr
    proc = _arm("--gguf", str(tmp_path / "none.gguf"))
    assert proc.returncode == 2 and "none.gguf: no such GGUF file" in proc.stderr
    assert "loaded in" not in proc.stderr
    proc = _arm("--gguf", gguf, "--batch", "4,1000")
    assert proc.returncode == 2 and "--batch 1000: llama.cpp decodes at most 256 sequences" in proc.stderr
    assert "loaded in" not in proc.stderr


def test_metric_line_keeps_speed_key_names():
    result = {"build": "x.gguf (llama.cpp Q4_1)", "load_s": 0.5,
              "rss_file_mb": 90.0, "config": {"use_mmap": True}, "out": "r.json",
              "metrics": {"pp512_tps": {"median": 300.0}, "tg128_tps": {"median": 40.0},
                          "b8_tg_tps": {"median": 150.0}},
              "memory_phases": {"load_peak_rss_anon_mb": 20.0, "bench_peak_rss_anon_mb": 60.0}}
    line = llamacpp_arm.metric_line(result)
    assert line["pp512_tps"] == 300.0 and line["tg128_tps"] == 40.0
    assert line["peak_rss_anon_mb"] == 60.0 and line["load_s"] == 0.5
    assert line["benchmark"] == "speed" and line["engine"] == "llama.cpp"
    assert line["b8_tg_tps"] == 150.0 and "batch" not in line
    assert list(line)[-1] == "out"


@pytest.mark.slow
def test_arm_on_the_default_gguf(tmp_path):
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_REASON)
    gguf = store.source_gguf(store.resolve_key("default"))
    out = tmp_path / "arm.json"
    proc = _arm("--gguf", str(gguf), "--prompt-len", "64", "--tg-tokens", "8", "--reps", "2",
                "--batch", "8", "--threads", "1", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = last_json_line(proc.stdout)
    assert proc.stdout.strip().splitlines()[-1].startswith("{")
    for key in ("pp64_tps", "tg8_tps", "b8_tg_tps", "load_s", "peak_rss_anon_mb"):
        assert isinstance(line[key], float) and line[key] > 0, key
    assert "batch" not in line
    assert line["engine"] == "llama.cpp" and "Q4_1" in line["build"]
    full = json.loads(out.read_text())
    assert full["pinning"]["threads"] == 1 and full["config"]["n_threads"] == 1
    assert len(full["runs"]["tg8_tps"]) == 2 and len(full["runs"]["b8_tg_tps"]) == 2
    # 8 sequences of the run's context each, as vLLM prices its KV cache for max_num_seqs
    ctx = full["batch_context"]
    assert ctx["n_seq_max"] == 8 and ctx["n_ctx_seq"] >= full["config"]["n_ctx"]
    b8 = [t for t in full["timings"] if t["metric"] == "b8_tg_tps"]
    assert len(b8) == 2 and all(t["seqs"] == 8 and t["t_n_s"] > t["t_1_s"] for t in b8)
    assert full["provenance"]["versions"]["llama-cpp-python"]
