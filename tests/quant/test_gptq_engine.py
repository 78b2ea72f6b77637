"""The `--quant gptq` export of SmolLM2-135M loads in stock vLLM through its in-tree CPU
GPTQ path (cpu_gemm_wna16 here: no AMX, so not W4A8) and matches the dequantized reference.
Where vLLM's kernel library has no cpu_gemm_wna16 (its AVX2 build), the engine refuses the
export at load, naming the op (patches/wna16_missing_op.py), instead of dying mid-run.

One engine (module-scoped); the reference is transformers in fp32 on the weights read back
from the packed checkpoint, run after the engine is torn down.
"""

from __future__ import annotations

import json

import pytest
import torch

from support.hosts import AMX_NUMERICS, amx_host
from vllm_edge.patches import wna16_missing_op

pytestmark = pytest.mark.slow
NO_OP = pytest.mark.skipif(not wna16_missing_op.op_present(),
                           reason="this CPU's vLLM build has no cpu_gemm_wna16: the export is refused "
                                  "(test_refused_at_load_where_the_op_is_missing)")

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


def _reference_logprobs(q_dir, ids):
    """fp32 transformers forward on the dequantized GPTQ tensors: the expectation."""
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM

    from vllm_edge.quant import gptq

    cfg = json.loads((q_dir / "config.json").read_text())
    cfg.pop("quantization_config")
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    state, groups = {}, {}
    with safe_open(str(q_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            base, _, suffix = name.rpartition(".")
            if suffix in ("qweight", "qzeros", "scales", "g_idx"):
                groups.setdefault(base, {})[suffix] = f.get_tensor(name)
            else:
                state[name] = f.get_tensor(name).float()
    for base, t in groups.items():
        state[f"{base}.weight"] = gptq.dequantize(t)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return torch.log_softmax(logits.float(), -1)


@pytest.fixture(scope="module")
def gptq_dir(default_model_dir):
    from vllm_edge.models import store

    # cached under VLLM_EDGE_HOME like the bf16 build, so only the first CI run pays for it
    return store.prepare_quantized("default", "gptq", 64, progress=False)


@pytest.mark.skipif(wna16_missing_op.op_present(), reason="this CPU's vLLM build has cpu_gemm_wna16")
def test_refused_at_load_where_the_op_is_missing(gptq_dir, run_llm):
    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(gptq_dir, max_model_len=512, max_num_seqs=1, enforce_eager=True,
                       kv_cache_memory_bytes=64 << 20)
    with pytest.raises(Exception) as err:
        run_llm(lambda llm: None, **edge.kwargs, seed=0)
    text = "".join(str(e) for e in (err.value, err.value.__cause__) if e is not None)
    assert "cpu_gemm_wna16" in text and "cpu_int4" in text, text
    assert "_OpNamespace" not in text  # refused at load, not failed at the first forward


@pytest.fixture(scope="module")
def gptq_run(gptq_dir, run_llm):
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_edge.runtime.engine import edge_engine
    from vllm_edge.runtime.kv import kv_budget_for

    q_dir = gptq_dir
    ids = AutoTokenizer.from_pretrained(str(q_dir)).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    cfg = json.loads((q_dir / "config.json").read_text())
    block = kv_budget_for(cfg, 128, 1, "bfloat16", 128).flat_bytes // 2  # one 128-token block
    edge = edge_engine(q_dir, max_model_len=512, max_num_seqs=1, enforce_eager=True,
                       kv_cache_memory_bytes=(64 << 20) + block)

    def describe(m):
        out = {}
        for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.down_proj", "lm_head"):
            mod = m.get_submodule(name)
            qm = mod.quant_method
            out[name] = {"method": type(qm).__name__,
                         "kernel": type(getattr(qm, "kernel", None)).__name__,
                         "w4a8": getattr(mod, "use_w4a8", None), "isa": getattr(mod, "isa_hint", None)}
        out["embed"] = type(m.get_submodule("model.embed_tokens").quant_method).__name__
        return out

    def use(llm):
        first = llm.generate(TokensPrompt(prompt_token_ids=ids),
                             SamplingParams(temperature=0, max_tokens=1, logprobs=5), use_tqdm=False)[0]
        answer = llm.generate(TokensPrompt(prompt_token_ids=ids),
                              SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
        return first, answer, llm.apply_model(describe)[0]

    first, answer, layers = run_llm(use, **edge.kwargs, seed=0)
    ref = _reference_logprobs(q_dir, ids)
    return first.outputs[0], answer.outputs[0].text, layers, ref


@NO_OP
def test_loads_through_the_in_tree_cpu_gptq_path(gptq_run):
    _, answer, layers, _ = gptq_run
    print(layers, "\nanswer:", answer)
    for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.down_proj", "lm_head"):
        assert layers[name]["method"] == "AutoGPTQLinearMethod", (name, layers[name])
        assert layers[name]["kernel"] == "CPUWNA16LinearKernel", (name, layers[name])
    assert layers["embed"] == "UnquantizedEmbeddingMethod"  # the head is quantized, untied


@NO_OP
@pytest.mark.xfail(amx_host(), reason=AMX_NUMERICS, strict=False)
def test_first_token_matches_the_dequantized_reference(gptq_run):
    first, _, _, ref = gptq_run
    token = first.token_ids[0]
    lp = first.logprobs[0]
    print("vllm top:", {t: round(v.logprob, 3) for t, v in lp.items()},
          "ref top:", {int(t): round(float(ref[t]), 3) for t in ref.topk(5).indices})
    assert token == int(ref.argmax())
    # bf16 activations in vLLM against an fp32 reference on the same weights
    for t, v in lp.items():
        assert abs(v.logprob - float(ref[t])) < 0.3, (t, v.logprob, float(ref[t]))
