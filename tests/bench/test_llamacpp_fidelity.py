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


def test_tokenizer_agreement_compares_llama_cpps_ids_with_ours(default_model_dir):
    """On the same text, llama.cpp's tokenizer of the shipped file gives our ids; an id list that
    differs (one token short, or a BOS llama.cpp would not add to a completion) is named."""
    need_llama_cpp()
    from transformers import AutoTokenizer

    from support.llamacpp import default_gguf
    from vllm_edge.bench import prompts as P
    from vllm_edge.bench.fidelity import engine as fidelity

    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    items = P.select_fidelity_prompts(("chat-capital", "tool-weather"))
    ids = fidelity.chat_prompt_ids(tok, items)
    gguf = default_gguf()
    assert llamacpp_fidelity.tokenizer_agreement(gguf, tok, items, ids) == \
        {"identical": 2, "prompts": 2, "differs_on": []}
    short = [ids[0], ids[1][:-1]]
    assert llamacpp_fidelity.tokenizer_agreement(gguf, tok, items, short)["differs_on"] == ["tool-weather"]
    tok.chat_template = None  # a base model: each prompt's plain text, a completion
    plain = fidelity.chat_prompt_ids(tok, items)
    assert plain != ids and llamacpp_fidelity.tokenizer_agreement(gguf, tok, items, plain)["identical"] == 2
    extra_bos = [[tok.bos_token_id, *p] for p in plain]
    assert llamacpp_fidelity.tokenizer_agreement(gguf, tok, items, extra_bos)["identical"] == 0
