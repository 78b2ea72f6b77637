"""The llama.cpp arm on the default GGUF (needs llama-cpp-python) prints bench speed's metric
JSON as its last stdout line."""

from __future__ import annotations

import json

import pytest

from support.llamacpp import default_gguf, need_llama_cpp, run_arm
from vllm_edge.common.jsonline import last_json_line

pytestmark = pytest.mark.slow


def test_arm_on_the_default_gguf(tmp_path):
    need_llama_cpp()
    gguf = default_gguf()
    out = tmp_path / "arm.json"
    proc = run_arm("--gguf", str(gguf), "--prompt-len", "64", "--tg-tokens", "8", "--reps", "2",
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
