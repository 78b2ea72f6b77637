"""The llama.cpp side of "each build against its own bf16": same line keys and definitions as
`vllm-edge fidelity`, and a missing file is named (a build scored against itself is in
test_llamacpp_fidelity_engine)."""

from __future__ import annotations

import subprocess
import sys

from support.llamacpp import need_llama_cpp
from vllm_edge.bench.fidelity import run as fidelity_cli
from vllm_edge.bench.llamacpp import fidelity as llamacpp_fidelity


def test_metric_line_has_vllm_fidelity_keys_plus_full_kl():
    report = {"build": "m.Q4_K_M.gguf (llama.cpp Q4_K_M)",
              "greedy": {"exact_matches": 4, "kept_fraction": 0.5, "first_token_agreement": 0.9},
              "teacher_forced": {"top1_agreement": 0.9, "kl_mean": 0.05, "kl_median": 0.01, "kl_p99": 0.6,
                                 "delta_logprob": -0.04, "coverage": 1.0, "kl_full_mean": 0.054},
              "out": "f.json"}
    line = llamacpp_fidelity.metric_line(report)
    vllm_keys = {k for keys in fidelity_cli.LINE_KEYS.values() for k in keys}
    assert vllm_keys <= set(line)
    assert line["kl_mean"] == 0.05 and line["kl_full_mean"] == 0.054  # top-k+tail KL, not the full one
    assert line["benchmark"] == "fidelity" and line["engine"] == "llama.cpp" and line["out"] == "f.json"


def test_missing_gguf_is_named(tmp_path, default_model_dir):
    need_llama_cpp()
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "bench", "llamacpp-fidelity",
                           "--ref", str(tmp_path / "ref.gguf"), "--cand", str(tmp_path / "ref.gguf"),
                           "--tokenizer", str(default_model_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"{tmp_path / 'ref.gguf'}: no such GGUF file" in proc.stderr
