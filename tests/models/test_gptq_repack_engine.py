"""A repacked GPTQ export in real vLLM: the default model exported with `--quant gptq --group 64`,
repacked into cpu_int4, loads with the cpu_int4 methods and answers the capital-of-France prompt.

One engine (2-core machine), eager, short context.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repacked(default_model_dir, tmp_path_factory):
    from vllm_edge.models.gptq_repack import REPORT_NAME, repack_gptq
    from vllm_edge.quant.quantize import quantize_model

    tmp = tmp_path_factory.mktemp("gptq")
    src = quantize_model(default_model_dir, tmp / "g64", "gptq", 64, progress=False)
    out = repack_gptq(src, tmp / "rp", progress=False)
    return out, json.loads((out / REPORT_NAME).read_text())


def test_the_repacked_gptq_export_runs_cpu_int4(repacked, run_llm):
    from vllm import SamplingParams

    out, report = repacked
    assert report["group_size"] == 64 and report["max_error_over_bound"] == 0

    def use(llm):
        conv = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
        o = llm.chat([conv], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
        methods = llm.apply_model(lambda m: sorted({type(x.quant_method).__name__ for x in m.modules()
                                                    if getattr(x, "quant_method", None) is not None}))
        return o.outputs[0].text, methods[0]

    text, methods = run_llm(use, model=str(out), enforce_eager=True, max_model_len=512,
                            kv_cache_memory_bytes=64 << 20, dtype="bfloat16", seed=0)
    assert "CpuInt4LinearMethod" in methods and "CpuInt4EmbeddingMethod" in methods, methods
    assert "UnquantizedLinearMethod" not in methods, methods
    assert "Paris" in text, text
