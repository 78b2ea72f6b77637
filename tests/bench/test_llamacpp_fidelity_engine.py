"""The llama.cpp side of "each build against its own bf16" (needs llama-cpp-python): a build
scored against itself is perfect."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.llamacpp import default_gguf, need_llama_cpp
from vllm_edge.common.jsonline import last_json_line

pytestmark = pytest.mark.slow


def test_a_build_against_itself_is_perfect(tmp_path, default_model_dir):
    need_llama_cpp()
    gguf = str(default_gguf())
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
