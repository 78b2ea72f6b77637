"""llama.cpp's own tensor types in real vLLM, against llama.cpp on the same file (needs
llama-cpp-python).

The files are the default model's bf16 import exported to GGUF and quantized by llama.cpp's own
``llama_model_quantize`` (what a llama.cpp user gets): Q4_K_M, which is mostly Q5_0 with Q6_K,
Q8_0 and Q4_K tensors at this size, and Q5_K_M (Q5_1, Q5_K, Q6_K, Q8_0). Each is repacked as
``run --model FILE.gguf`` does (every tensor's codes kept, cpu_int4 and cpu_int8 mixed per
layer) and scored teacher-forced against llama.cpp's logits on the same token ids.

The comparison must be able to fail: the same Q4_K_M build with the two 4-bit halves of every
5-bit code swapped (what a wrong nibble order in the repack would write) is scored too and
must land far below the floor.
"""

from __future__ import annotations

import json
import shutil

import pytest

from support.llamacpp import need_llama_cpp

pytestmark = pytest.mark.slow

TYPES = ("Q4_K_M", "Q5_K_M")
K = 20
GREEDY = 16
# the engines' floor on a bf16 file is ~0.96 top-1 / ~0.004 KL (docs/guide/models.md); a
# file's own types kept at their precision must stay at it
TOP1_FLOOR, KL_CEILING = 0.93, 0.01


@pytest.fixture(scope="module")
def files(tmp_path_factory, default_model_dir):
    need_llama_cpp()
    from vllm_edge.models.gguf_export import export_all

    out = tmp_path_factory.mktemp("types") / "smollm2.gguf"
    paths = export_all(default_model_dir, out, quants=TYPES, progress=False)
    paths[0].unlink()  # the bf16 export: only the quantized files are scored
    return dict(zip(TYPES, paths[1:]))


@pytest.fixture(scope="module")
def token_ids(default_model_dir):
    from transformers import AutoTokenizer

    from vllm_edge.bench import prompts as P
    from vllm_edge.bench.fidelity import engine as fidelity

    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    prompt_ids = fidelity.chat_prompt_ids(tok)[:4]
    chunks = P.corpus_chunks(lambda s: tok.encode(s, add_special_tokens=False), 128, 3)
    return prompt_ids, chunks, tok.eos_token_id


def _llamacpp_reference(gguf, token_ids, tmp_path):
    from vllm_edge.bench.fidelity import engine as fidelity
    from vllm_edge.bench.llamacpp.fidelity import collect

    prompt_ids, chunks, eos = token_ids
    data = collect(gguf, prompt_ids, chunks, K, GREEDY, eos)
    return fidelity.load_reference(fidelity.save_reference(tmp_path / "ref", data))


def _vllm_score(run_llm, model_dir, reference):
    from vllm_edge.bench.fidelity import engine as fidelity

    def use(llm):
        data = fidelity.collect(llm, None, k=K, greedy_tokens=GREEDY,
                                prompt_ids=reference["prompt_ids"], chunks=reference["chunks"])
        methods = llm.apply_model(lambda m: sorted({type(x.quant_method).__name__ for x in m.modules()
                                                    if getattr(x, "quant_method", None) is not None}))
        packed = llm.apply_model(lambda m: sum(1 for x in m.modules() if getattr(x, "lowbit_parts", None)))
        return fidelity.score(reference, data), methods[0], packed[0]

    return run_llm(use, model=str(model_dir), enforce_eager=True, max_model_len=512, max_logprobs=K,
                   kv_cache_memory_bytes=64 << 20, dtype="bfloat16", seed=0, enable_prefix_caching=False)


@pytest.mark.parametrize("qtype", TYPES)
def test_the_files_own_types_run_at_llama_cpps_fidelity(qtype, files, token_ids, run_llm, tmp_path):
    from vllm_edge.models import store
    from vllm_edge.models.gguf_repack import REPORT_NAME
    from vllm_edge.quant import formats, lowbit

    src = files[qtype]
    build = store.ensure_gguf(str(src), formats.DEFAULT)
    report = json.loads((build / REPORT_NAME).read_text())
    assert set(report["routes"]) <= {"repack", "repack8"} and report["max_error_over_bound"] <= 1
    reference = _llamacpp_reference(src, token_ids, tmp_path)
    scored, methods, packed = _vllm_score(run_llm, build, reference)
    tf = scored["teacher_forced"]
    print(f"{qtype}: types {report['gguf_types']}, routes {report['routes']}, bytes vs file "
          f"{report['bytes_vs_gguf']} stored, {report['runtime_bytes_vs_gguf']} read, {packed} layers "
          f"packed: top-1 {tf['top1_agreement']:.3f}, KL {tf['kl_mean']:.4f}, "
          f"greedy exact {scored['greedy']['exact_matches_str']}, first token {scored['greedy']['first_token_agreement']:.2f}")
    assert "CpuInt8LinearMethod" in methods and "UnquantizedLinearMethod" not in methods
    # the 5- and 6-bit layers ran packed (quant/lowbit.py) where this CPU has the product
    assert (packed > 0) == lowbit.supported(), packed
    assert report["runtime_bytes_vs_gguf"] <= 1.1, report["runtime_bytes_vs_gguf"]
    assert tf["top1_agreement"] >= TOP1_FLOOR and tf["kl_mean"] <= KL_CEILING, tf


def test_a_wrong_repack_fails_the_comparison(files, token_ids, run_llm, tmp_path):
    """Swapping the low and high nibble of every 5-bit code (c = x - 16, x = lo | hi << 4) is a
    repack bug the comparison above must catch."""
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_edge.models import store
    from vllm_edge.quant import formats

    src = files["Q4_K_M"]
    good = store.ensure_gguf(str(src), formats.DEFAULT)
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    w = load_file(str(bad / "model.safetensors"))
    for name, t in w.items():
        if name.endswith("weight_int8") and "embed" not in name:
            x = (t.to(torch.int16) + 16) & 0xFF
            if int(x.max()) < 32:  # a 5-bit tensor: swap within the 8-bit field's two nibbles
                w[name] = ((((x & 0xF) << 4) | (x >> 4)) & 0x1F).sub(16).to(torch.int8)
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
    reference = _llamacpp_reference(src, token_ids, tmp_path)
    scored, _, _ = _vllm_score(run_llm, bad, reference)
    tf = scored["teacher_forced"]
    print(f"swapped nibbles: top-1 {tf['top1_agreement']:.3f}, KL {tf['kl_mean']:.4f}")
    assert tf["top1_agreement"] < TOP1_FLOOR and tf["kl_mean"] > KL_CEILING
