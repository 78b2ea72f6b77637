"""Fidelity of a quantized GGUF against its own BF16 GGUF, both in llama.cpp (design.md §5).

The llama.cpp side of "each engine against its own bf16": greedy divergence
over the 12 fidelity prompts and teacher-forced top-1 / KL over the pydoc
corpus, with the same metric code as the vLLM side. Token ids come from the
bf16 model directory's tokenizer so both builds read identical sequences::

    python -m vllm_edge.bench.llamacpp.fidelity --ref m.bf16.gguf --cand m.Q4_K_M.gguf --tokenizer DIR

The last stdout line carries the keys of `vllm-edge fidelity`'s line, with the
same definitions: ``kl_mean`` is the KL over the reference's top ``--kl-k``
ids plus a tail bucket (vLLM's side can only report that one), and the exact
full-vocabulary KL that llama.cpp's full logits allow is added as
``kl_full_mean``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from vllm_edge.bench.fidelity import run as fidelity_run
from vllm_edge.bench.fidelity.engine import DEFAULT_KL_K
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_edge.bench.llamacpp.fidelity",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="the BF16 GGUF")
    p.add_argument("--cand", required=True, help="the quantized GGUF")
    p.add_argument("--tokenizer", required=True, help="model directory whose tokenizer makes the token ids")
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--chunk-len", type=int, default=512)
    p.add_argument("--prompt-ids", default=None, metavar="ID[,ID...]",
                   help="a subset of the 12 fidelity prompts (default: all)")
    p.add_argument("--kl-k", type=int, default=DEFAULT_KL_K,
                   help="reference top-k ids the KL covers, plus a tail bucket (default %(default)s, "
                        "as `vllm-edge fidelity`)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from vllm_edge.bench.llamacpp import runner as llamacpp_runner

    if not llamacpp_runner.available():
        print(f"error: {llamacpp_runner.SKIP_REASON}", file=sys.stderr)
        return 2
    for f in (a.ref, a.cand):
        if not Path(f).is_file():
            print(f"error: {f}: no such GGUF file", file=sys.stderr)
            return 2
    cfg = gguf_verify.VerifyConfig(greedy_tokens=a.greedy_tokens, chunks=a.chunks, chunk_len=a.chunk_len,
                                   threads=a.threads,
                                   prompt_ids=tuple(a.prompt_ids.split(",")) if a.prompt_ids else None)
    try:
        report = run(a.ref, a.cand, a.tokenizer, cfg, kl_k=a.kl_k)
    except ValueError as exc:  # e.g. an unknown prompt id, refused before any model loads
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.out:
        from vllm_edge.common import atomic, provenance

        report["provenance"] = provenance.collect(model=Path(a.cand), threads=a.threads)
        atomic.write_result(a.out, report)
    print(json.dumps(metric_line(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
