"""Fidelity of a quantized GGUF against its own BF16 GGUF, both in llama.cpp (design.md §5).

The llama.cpp side of "each engine against its own bf16": greedy divergence
over the 12 fidelity prompts and teacher-forced top-1 / KL over the pydoc
corpus, with the same metric code as the vLLM side. Token ids come from the
bf16 model directory's tokenizer so both builds read identical sequences::

    python -m vllm_edge.harness.llamacpp_fidelity --ref m.bf16.gguf --cand m.Q4_K_M.gguf --tokenizer DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from vllm_edge.models import gguf_verify


class _TokenizerOnly:
    """The two methods :func:`gguf_verify.build_inputs` needs, without loading weights."""

    def __init__(self, model_dir: str | Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.eos_id = self.tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def run(ref: str | Path, cand: str | Path, tokenizer_dir: str | Path,
        cfg: gguf_verify.VerifyConfig | None = None, log=lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    cfg = cfg or gguf_verify.VerifyConfig()
    inputs = gguf_verify.build_inputs(_TokenizerOnly(tokenizer_dir), cfg)
    r = gguf_verify.llamacpp_reference(ref, inputs, cfg, lambda s: log(f"[ref] {s}"))
    c = gguf_verify.llamacpp_reference(cand, inputs, cfg, lambda s: log(f"[cand] {s}"))
    report = gguf_verify.compare(r, c, inputs, cfg, quantized=True)
    for k in ("passed", "criterion"):  # a fidelity measurement, not a parity verdict
        report.pop(k, None)
    report.update({"engine": "llama.cpp", "reference": str(ref), "candidate": str(cand),
                   "config": asdict(cfg)})
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_edge.harness.llamacpp_fidelity",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="the BF16 GGUF")
    p.add_argument("--cand", required=True, help="the quantized GGUF")
    p.add_argument("--tokenizer", required=True, help="model directory whose tokenizer makes the token ids")
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--chunk-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    cfg = gguf_verify.VerifyConfig(greedy_tokens=a.greedy_tokens, chunks=a.chunks, chunk_len=a.chunk_len,
                                   threads=a.threads)
    report = run(a.ref, a.cand, a.tokenizer, cfg)
    if a.out:
        from vllm_edge import atomic

        atomic.write_json(a.out, report)
    g, tf = report["greedy"], report["teacher_forced"]
    print(json.dumps({"benchmark": "fidelity", "engine": "llama.cpp", "candidate": Path(a.cand).name,
                      "exact_matches": g["exact_matches"], "kept_fraction": g["kept_fraction"],
                      "first_token_agreement": g["first_token_agreement"],
                      "top1_agreement": tf["top1_agreement"], "kl_mean": tf["kl_full_mean"],
                      "kl_median": tf["kl_full_median"], "kl_p99": tf["kl_full_p99"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
