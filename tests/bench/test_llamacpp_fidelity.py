"""The llama.cpp side of "each build against its own bf16": same line keys and definitions as
`vllm-edge fidelity`, and a build scored against itself is perfect."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_edge.bench.fidelity import run as fidelity_cli
from vllm_edge.bench.llamacpp import fidelity as llamacpp_fidelity
from vllm_edge.bench.llamacpp.runner import SKIP_REASON
from vllm_edge.common.jsonline import last_json_line
from vllm_edge.models import store


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
    pytest.importorskip("llama_cpp", reason=SKIP_REASON)
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "bench", "llamacpp-fidelity",
                           "--ref", str(tmp_path / "ref.gguf"), "--cand", str(tmp_path / "ref.gguf"),
                           "--tokenizer", str(default_model_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"{tmp_path / 'ref.gguf'}: no such GGUF file" in proc.stderr


@pytest.mark.slow
def test_a_build_against_itself_is_perfect(tmp_path, default_model_dir):
    pytest.importorskip("llama_cpp", reason=SKIP_REASON)
    gguf = str(store.source_gguf(store.resolve_key("default")))
    out = tmp_path / "fid.json"
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "bench", "llamacpp-fidelity", "--ref", gguf,
                           "--cand", gguf, "--tokenizer", str(default_model_dir), "--greedy-tokens", "4",
                           "--prompt-ids", "chat-capital,chat-code,tool-weather",
                           "--chunks", "1", "--chunk-len", "128", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = last_json_line(proc.stdout)
    assert line["exact_matches"] == 3 and line["top1_agreement"] == 1.0
    assert line["kl_mean"] < 1e-9 and line["kl_full_mean"] < 1e-9 and line["coverage"] == pytest.approx(1.0)
    full = json.loads(out.read_text())
    assert full["kl_k"] == 10 and full["teacher_forced"]["positions"] == 63
    assert full["provenance"]["model"]["sha256"]
