"""Fidelity of a quantized GGUF against its own BF16 GGUF, both in llama.cpp (docs/design/fidelity.md).

The llama.cpp side of "each engine against its own bf16": greedy divergence
over the 12 fidelity prompts and teacher-forced top-1 / KL over the pydoc
corpus, with the same metric code as the vLLM side. Token ids come from the
bf16 model directory's tokenizer so both builds read identical sequences::

    vllm-edge bench llamacpp-fidelity --ref m.bf16.gguf --cand m.Q4_K_M.gguf --tokenizer DIR

The last stdout line carries the keys of `vllm-edge fidelity`'s line, with the
same definitions: ``kl_mean`` is the KL over the reference's top ``--kl-k``
ids plus a tail bucket (vLLM's side can only report that one), and the exact
full-vocabulary KL that llama.cpp's full logits allow is added as
``kl_full_mean``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from vllm_edge.bench.fidelity import run as fidelity_run
from vllm_edge.bench.fidelity.defaults import DEFAULT_KL_K
from vllm_edge.bench.llamacpp import verify as gguf_verify


class _TokenizerOnly:
    """The two methods :func:`gguf_verify.build_inputs` needs, without loading weights."""

    def __init__(self, model_dir: str | Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.eos_id = self.tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def run(ref: str | Path, cand: str | Path, tokenizer_dir: str | Path,
        cfg: gguf_verify.VerifyConfig | None = None, kl_k: int = DEFAULT_KL_K,
        log=lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    cfg = cfg or gguf_verify.VerifyConfig()
    inputs = gguf_verify.build_inputs(_TokenizerOnly(tokenizer_dir), cfg)
    r = gguf_verify.llamacpp_reference(ref, inputs, cfg, lambda s: log(f"[ref] {s}"))
    c = gguf_verify.llamacpp_reference(cand, inputs, cfg, lambda s: log(f"[cand] {s}"))
    report = gguf_verify.compare(r, c, inputs, cfg, quantized=True, kl_k=kl_k)
    for k in ("passed", "criterion"):  # a fidelity measurement, not a parity verdict
        report.pop(k, None)
    report.update({"benchmark": "fidelity", "engine": "llama.cpp", "build": build_label(cand),
                   "reference_build": build_label(ref), "reference": str(ref), "candidate": str(cand),
                   "kl_k": kl_k, "config": asdict(cfg)})
    return report


def build_label(gguf: str | Path) -> str:
    from vllm_edge.bench.llamacpp.runner import quantization_types

    return f"{Path(gguf).name} (llama.cpp {'/'.join(sorted(quantization_types(gguf)))})"


def metric_line(report: dict) -> dict:
    """`vllm-edge fidelity`'s line keys (same definitions), plus the exact full-vocabulary KL."""
    line: dict = {"benchmark": "fidelity", "engine": "llama.cpp", **fidelity_run.metric_line(report)}
    line["kl_full_mean"] = report["teacher_forced"]["kl_full_mean"]
    if report.get("out"):
        line["out"] = report["out"]
    return line
