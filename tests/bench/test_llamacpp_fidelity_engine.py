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
# vLLM's lossless repack against llama.cpp on the same Q4_1 file, teacher-forced: 0.962 over
# 2040 positions (benchmarks/results/fidelity_vs_llamacpp_q4_1_*.json); bf16 activations in
# vLLM against llama.cpp's f32/Q8 ones set that floor. Margin for the 510 positions here.
TOP1_SAME_FILE = 0.93


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


def _fidelity(*args):
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "fidelity", *args],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json_line(proc.stdout)


def _cut(ref_dir, out_dir, prompts):
    """The first ``prompts`` prompts and the first corpus chunk of a saved reference, as a
    reference of its own (the same values)."""
    from vllm_edge.bench import prompts as P
    from vllm_edge.bench.fidelity import engine as fidelity

    ref = fidelity.load_reference(ref_dir)
    n = len(P.scored_range(len(ref["chunks"][0])))
    positions = [dict(zip(i.tolist(), v.tolist())) for i, v in zip(ref["ids"][:n], ref["lp"][:n])]
    data = {"prompt_ids": ref["prompt_ids"][:prompts], "greedy": ref["greedy"][:prompts],
            "chunks": ref["chunks"][:1], "k": ref["k"], "positions": positions,
            "target_lp": ref["target_lp"][:n].tolist()}
    return fidelity.save_reference(out_dir, data, meta=ref["meta"])


def test_llama_cpp_is_the_reference_of_a_vllm_build_of_the_same_file(tmp_path, default_model_dir):
    """`fidelity --engine llama.cpp` saves llama.cpp on the shipped Q4_1 file as the reference;
    vLLM's repack of that file (every code kept: Q4_1 as cpu_int4, the Q8_0 embedding and tied
    head as cpu_int8) follows it, and the build that quantizes the bf16 import again to 4 bits,
    head included, scored the same way, is further off."""
    need_llama_cpp()
    from vllm_edge.models import store

    ref = tmp_path / "ref"
    # three short prompts: a long-context prompt's prefill takes llama.cpp seconds here, and the
    # figures asserted below come from the corpus chunks
    saved = _fidelity("--engine", "llama.cpp", "--model", "default", "--save-ref", str(ref),
                      "--prompts", "chat-capital,chat-code,tool-weather",
                      "--corpus-chunks", "2", "--chunk-len", "256", "--greedy-tokens", "8")
    assert saved["benchmark"] == "fidelity-reference"
    meta = json.loads((ref / "meta.json").read_text())
    assert meta["prompts"] == ["chat-capital", "chat-code", "tool-weather"] and len(meta["prompt_ids"]) == 3
    # llama.cpp scored against its own reference is perfect; on a cut of it (two prompts, one
    # chunk)
    itself = _fidelity("--engine", "llama.cpp", "--model", "default", "--ref",
                       str(_cut(ref, tmp_path / "ref-cut", prompts=2)))
    assert itself["top1_agreement"] == 1.0 and itself["kl_mean"] < 1e-9 and itself["exact_matches"] == 2

    lossless = store.prepare_repacked("default", progress=False)
    four_bit_head = store.prepare_quantized("default", "cpu_int4", 32, progress=False)
    a = _fidelity("--ref", str(ref), "--model", str(lossless), "--enforce-eager")
    b = _fidelity("--ref", str(ref), "--model", str(four_bit_head), "--enforce-eager")
    print(f"vs llama.cpp Q4_1: repack (codes kept) {a}; requantized cpu_int4 {b}")
    assert a["top1_agreement"] >= TOP1_SAME_FILE
    assert a["kl_mean"] < b["kl_mean"] / 5 and a["top1_agreement"] > b["top1_agreement"]


def test_the_exact_weights_reference_is_llama_cpp_on_the_dequantized_file(tmp_path, default_model_dir):
    """`--dequantized` saves llama.cpp on an F32 copy of the file (every tensor dequantized) and
    removes the copy: llama.cpp on such a copy made by hand matches it exactly, while the
    quantized file itself, whose products round the activations to 8 bits, does not."""
    need_llama_cpp()
    import os

    from vllm_edge.bench.llamacpp.verify import dequantized_copy

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    exact = tmp_path / "exact"
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "fidelity", "--engine", "llama.cpp",
                           "--dequantized", "--model", "default", "--save-ref", str(exact),
                           "--out", str(tmp_path / "exact.json"),
                           "--prompts", "chat-capital,tool-weather", "--corpus-chunks", "1",
                           "--chunk-len", "128", "--greedy-tokens", "4"],
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the F32 copy went with its temporary directory (torch may leave its compile cache there)
    assert not list(scratch.glob("vllm-edge-f32-*")) and not list(scratch.rglob("*.gguf"))
    assert json.loads((tmp_path / "exact.json").read_text())["tokenizer_agreement"]["identical"] == 2
    meta = json.loads((exact / "meta.json").read_text())
    assert meta["meta"]["dequantized"] is True and "exact weights" in meta["meta"]["build"]

    by_hand = dequantized_copy(default_gguf(), tmp_path / "by-hand.f32.gguf")
    same = _fidelity("--engine", "llama.cpp", "--model", str(by_hand), "--tokenizer", str(default_model_dir),
                     "--ref", str(exact))
    assert same["top1_agreement"] == 1.0 and same["kl_mean"] < 1e-9 and same["exact_matches"] == 2
    quantized = _fidelity("--engine", "llama.cpp", "--model", "default", "--ref", str(exact))
    assert quantized["kl_mean"] > 1e-5
