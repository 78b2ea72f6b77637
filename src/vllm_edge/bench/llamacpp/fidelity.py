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

import contextlib
import sys
import tempfile
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
    from vllm_edge.bench.engines.llamacpp import quantization_types

    return f"{Path(gguf).name} (llama.cpp {'/'.join(sorted(quantization_types(gguf)))})"


def metric_line(report: dict) -> dict:
    """`vllm-edge fidelity`'s line keys (same definitions), plus the exact full-vocabulary KL."""
    line: dict = {"benchmark": "fidelity", "engine": "llama.cpp", **fidelity_run.metric_line(report)}
    line["kl_full_mean"] = report["teacher_forced"]["kl_full_mean"]
    if report.get("out"):
        line["out"] = report["out"]
    return line


# --- llama.cpp as either side of `vllm-edge fidelity` ---------------------------------------

def tokenizer_agreement(gguf: str | Path, tokenizer, items: list[dict], prompt_ids: list[list[int]]) -> dict:
    """llama.cpp's own tokenizer (the file's vocabulary, special tokens parsed) against the ids
    our tokenizer gave each prompt (``prompt_ids``, from :func:`fidelity.chat_prompt_ids`), on the
    same text: the chat template's rendering, or for a base model the plain text, where each side
    adds a BOS as its own settings say (``add_bos_token``; llama.cpp: the file's
    ``tokenizer.ggml.add_bos_token``)."""
    from llama_cpp import Llama

    from vllm_edge.bench.fidelity import engine as fidelity

    llm = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    try:
        differs: list[str] = []
        for item, ours in zip(items, prompt_ids):
            plain = fidelity.completion_text(tokenizer, item)
            if plain is None:
                text = tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
                theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
            else:  # a base model's completion: each side adds the BOS its settings ask for
                theirs = llm.tokenize(plain.encode(), add_bos=True, special=True)
            if list(theirs) != list(ours):
                differs.append(item["id"])
    finally:
        llm.close()
    return {"identical": len(items) - len(differs), "prompts": len(items), "differs_on": differs}


def collect(gguf: str | Path, prompt_ids: list[list[int]], chunks: list[list[int]], k: int,
            greedy_tokens: int, eos: int | None, threads: int | None = None) -> dict:
    """What :func:`vllm_edge.bench.fidelity.engine.collect` gathers from vLLM, from llama.cpp
    on the same token ids: greedy continuations, and the top-``k`` log-probs and the target's
    log-prob at every scored corpus position (from llama.cpp's full logits)."""
    import torch

    from vllm_edge.bench import prompts as P
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner

    longest = max((len(p) for p in prompt_ids), default=0) + greedy_tokens
    with llamacpp_runner.runner(gguf, n_ctx=longest, threads=threads) as r:
        greedy = [r.greedy(ids, greedy_tokens, eos) for ids in prompt_ids]
    positions: list[dict[int, float]] = []
    target: list[float] = []
    if chunks:
        with llamacpp_runner.runner(gguf, n_ctx=max(map(len, chunks)), threads=threads, all_logits=True) as r:
            for c in chunks:
                lp = torch.log_softmax(torch.from_numpy(r.logits(c)).double(), -1)
                for t in P.scored_range(len(c)):
                    top = torch.topk(lp[t], k)
                    positions.append(dict(zip(top.indices.tolist(), top.values.tolist())))
                    target.append(float(lp[t, c[t + 1]]))
    return {"prompt_ids": prompt_ids, "greedy": greedy, "chunks": chunks, "k": k,
            "positions": positions, "target_lp": target}


def against_reference(gguf: str | Path, *, save_ref: str | None = None, ref: str | None = None,
                      tokenizer: str | Path | None = None, out: str | None = None,
                      corpus_chunks: int | None = None, chunk_len: int | None = None,
                      greedy_tokens: int | None = None, kl_k: int = DEFAULT_KL_K,
                      threads: int | None = None, prompts: tuple[str, ...] | None = None,
                      dequantized: bool = False) -> dict:
    """`vllm-edge fidelity --engine llama.cpp`: llama.cpp on ``gguf`` saved as a reference, or
    scored against one (a vLLM build's, or another GGUF's), with vLLM's token ids and metrics, so
    one table compares the engines on the same file.

    ``dequantized``: llama.cpp runs an F32 copy of the file instead, every tensor dequantized by
    gguf (:func:`gguf_verify.dequantized_copy`), made in a temporary directory and removed after: the
    file's exact weights in f32 arithmetic, with none of the activation rounding llama.cpp's
    quantized products add. Against it both engines' distance from the weights they were given
    can be told apart."""
    from vllm_edge.bench import prompts as P
    from vllm_edge.bench.engines import llamacpp as llamacpp_runner
    from vllm_edge.bench.fidelity import engine as fidelity
    from vllm_edge.bench.fidelity.defaults import DEFAULT_CORPUS_CHUNKS
    from vllm_edge.common import atomic, provenance

    if (save_ref is None) == (ref is None):
        raise ValueError("give exactly one of --save-ref DIR or --ref DIR")
    if prompts is not None and ref is not None:
        raise ValueError("--prompts picks what --save-ref saves; with --ref the reference decides")
    if not llamacpp_runner.available():
        raise ValueError(llamacpp_runner.SKIP_REASON)
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: no such GGUF file")
    if tokenizer is None:
        raise ValueError("--engine llama.cpp needs --tokenizer DIR: the model directory whose tokenizer "
                         "and chat template make the token ids (the same ones vLLM's side reads)")
    tok = _TokenizerOnly(tokenizer)
    build = build_label(gguf)
    if ref is not None:
        reference = fidelity.load_reference(ref)
        prompt_ids, chunks, k = reference["prompt_ids"], reference["chunks"], reference["k"]
        greedy_tokens = reference["meta"].get("greedy_tokens", greedy_tokens or fidelity.DEFAULT_GREEDY_TOKENS)
    else:
        items = P.select_fidelity_prompts(prompts)
        names = [p["id"] for p in items]
        prompt_ids = fidelity.chat_prompt_ids(tok.tokenizer, items)
        chunks = P.corpus_chunks(tok.encode, chunk_len or fidelity.DEFAULT_CHUNK,
                                 corpus_chunks or DEFAULT_CORPUS_CHUNKS)
        k = fidelity.DEFAULT_K
        greedy_tokens = greedy_tokens or fidelity.DEFAULT_GREEDY_TOKENS
    if dequantized:
        build = f"{gguf.name} (llama.cpp on an F32 copy, every tensor dequantized: the exact weights)"
    with (tempfile.TemporaryDirectory(prefix="vllm-edge-f32-") if dequantized else contextlib.nullcontext()) as td:
        runs = gguf
        if td:
            print(f"[fidelity] dequantizing {gguf.name} to an F32 copy in {td}", file=sys.stderr, flush=True)
            runs = gguf_verify.dequantized_copy(gguf, Path(td) / f"{gguf.stem}.f32.gguf")
        data = collect(runs, prompt_ids, chunks, k, greedy_tokens, tok.eos_id, threads)
    prov = provenance.collect(model=gguf, threads=threads)
    engine = {"engine": "llama.cpp", "threads": threads}
    if save_ref is not None:
        agreement = tokenizer_agreement(gguf, tok.tokenizer, items, prompt_ids)
        print(f"[fidelity] tokenizers: llama.cpp's gives our ids on {agreement['identical']} of "
              f"{agreement['prompts']} prompts" + (f" (differs on {', '.join(agreement['differs_on'])})"
                                                   if agreement["differs_on"] else ""), file=sys.stderr)
        fidelity.save_reference(save_ref, {**data, "prompts": names},
                                meta={"model": str(gguf), "build": build, "greedy_tokens": greedy_tokens,
                                      "dequantized": dequantized, "provenance": prov})
        result = {"benchmark": "fidelity-reference", "build": build, "model": str(gguf),
                  "dequantized": dequantized, "reference": str(save_ref), "prompts": len(prompt_ids), "chunks": len(chunks),
                  "k": k, "tokenizer_agreement": agreement, "engine": engine, "provenance": prov}
    else:
        scored = fidelity.score(reference, data, kl_k=kl_k)
        result = {"benchmark": "fidelity", "build": build, "model": str(gguf), "dequantized": dequantized,
                  "reference": str(ref),
                  "reference_build": reference["meta"].get("build"),
                  "reference_model": reference["meta"].get("model"), **scored,
                  "chunks": len(chunks), "engine": engine, "provenance": prov}
    return atomic.write_result(out, result)
