"""cpu_int4 on architectures other than Llama: random-weight Qwen2 (q/k/v biases) and
Qwen3 (per-head q/k RMSNorm) folders, quantized the way `run`/`serve` quantize a bf16 model
folder on first use (in a child process, cached by content) and run in real vLLM, against
an fp32 transformers forward on the weights read back from the checkpoint.

The prompt has 300 tokens, so the prefill runs the multi-row route (native dequantize +
bf16 GEMM; the head too, since prompt logprobs need every position) and the 8 decode steps
run tinygemm. Tolerance: |logprob(vLLM) - logprob(ref)| <= 0.1 nats at every prompt
position and every generated token. The engine computes in bf16 and the reference in
fp32 on the same weights; the observed gap is printed (a few hundredths). As a control, the
same comparison against the *unquantized* weights is printed and must be larger: the
4-bit error is visible at this tolerance, so a kernel that ran the wrong weights (or
dropped Qwen2's biases, std 0.5) could not pass.
"""

from __future__ import annotations

import json

import pytest
import torch

from vllm_edge.quant.groups import DEFAULT_GROUP

pytestmark = pytest.mark.slow

PROMPT_LEN = 300
GEN = 8
TOL = 0.1
SHAPE = dict(hidden=256, layers=2, vocab=49152, intermediate=768, heads=4, kv_heads=2, tied=True)


def _reference_logprobs(model_dir, ids, *, quantized: bool):
    """fp32 transformers forward; the cpu_int4 tensors are dequantized with pack.dequantize_plain."""
    import transformers
    from safetensors import safe_open

    from vllm_edge.quant import pack

    cfg = json.loads((model_dir / "config.json").read_text())
    qcfg = cfg.pop("quantization_config", None)
    model = getattr(transformers, cfg["architectures"][0])(transformers.AutoConfig.for_model(**cfg))
    state, groups = {}, {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                base, _, suffix = name.rpartition(".")
                if suffix in ("weight_packed", "weight_scale", "weight_zero"):
                    groups.setdefault(base, {})[suffix] = h.get_tensor(name)
                else:
                    state[name] = h.get_tensor(name).float()
    assert bool(groups) == quantized
    for base, t in groups.items():
        state[f"{base}.weight"] = pack.dequantize_plain(t["weight_packed"], t["weight_scale"],
                                                        t["weight_zero"], qcfg["group_size"])
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = cfg.get("tie_word_embeddings", False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if tied else set()), (missing, unexpected)
    if tied:
        model.tie_weights()
    model = model.float().eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def _run_vllm(run_llm, q_dir, ids):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_edge.runtime.engine import edge_engine

    edge = edge_engine(q_dir, max_model_len=512, max_num_seqs=1, enforce_eager=True,
                       enable_prefix_caching=False)

    def describe(m):
        return {name: (type(mod.quant_method).__name__, getattr(mod, "cpu_int4_mode", None),
                       getattr(mod, "bias", None) is not None)
                for name, mod in m.named_modules()
                if hasattr(mod, "quant_method") and name.count(".") <= 4}

    def use(llm):
        out = llm.generate(TokensPrompt(prompt_token_ids=ids),
                           SamplingParams(temperature=0, max_tokens=GEN, logprobs=1, prompt_logprobs=0,
                                          ignore_eos=True), use_tqdm=False)[0]
        return out, llm.apply_model(describe)[0]

    out, layers = run_llm(use, **edge.kwargs, seed=0)
    prompt_lp = [None] + [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])]
    gen = list(out.outputs[0].token_ids)
    gen_lp = [d[t].logprob for d, t in zip(out.outputs[0].logprobs, gen)]
    return prompt_lp, gen, gen_lp, layers


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def arch_run(request, default_model_dir, tmp_path_factory, run_llm):
    import shutil

    from vllm_edge.common import manifest
    from vllm_edge.models import synthetic
    from vllm_edge.runtime import weight_path

    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    made = synthetic.build(root / "made", synthetic.Shape.derive(**SHAPE, arch=arch),
                           tokenizer_from=default_model_dir, progress=False)
    # as a folder from elsewhere: no manifest of ours, so `run`/`serve` quantize it on first use
    src = root / "bf16"
    shutil.copytree(made, src)
    (src / manifest.NAME).unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_EDGE_HOME", str(root / "home"))
        mp.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": ["avx512f"]}))
        q_dir, wpath = weight_path.model_for_engine(str(src))
    assert (wpath.scheme, wpath.group) == ("cpu_int4", DEFAULT_GROUP)
    assert q_dir.parent == root / "home" / "models" / "hf"
    ids = torch.randint(1000, 40000, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt_lp, gen, gen_lp, layers = _run_vllm(run_llm, q_dir, ids)
    full = ids + gen
    ref = _reference_logprobs(q_dir, full, quantized=True)
    orig = _reference_logprobs(src, full, quantized=False)
    return arch, ids, prompt_lp, gen, gen_lp, layers, ref, orig


def _gaps(ids, prompt_lp, gen, gen_lp, ref):
    full = ids + gen
    lp = prompt_lp[1:] + gen_lp
    want = [float(ref[i - 1, full[i]]) for i in range(1, len(full))]
    return torch.tensor([abs(a - b) for a, b in zip(lp, want)])


def test_every_linear_runs_cpu_int4(arch_run):
    arch, *_, layers, _, _ = arch_run
    linears = {n: v for n, v in layers.items() if n.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))}
    assert len(linears) == 4 * SHAPE["layers"], sorted(layers)
    for name, (method, mode, _) in linears.items():
        assert method == "CpuInt4LinearMethod" and mode == "tinygemm", (name, method, mode)
    assert layers["lm_head"][0] == "CpuInt4EmbeddingMethod"  # untied and quantized
    assert layers["model.embed_tokens"][0] == "CpuInt4EmbeddingMethod"
    has_bias = [v[2] for n, v in linears.items() if n.endswith("qkv_proj")]
    assert all(has_bias) if arch == "qwen2" else not any(has_bias)


def test_logprobs_match_the_dequantized_reference(arch_run):
    arch, ids, prompt_lp, gen, gen_lp, _, ref, orig = arch_run
    gap = _gaps(ids, prompt_lp, gen, gen_lp, ref)
    control = _gaps(ids, prompt_lp, gen, gen_lp, orig)
    print(f"{arch}: |vLLM - dequantized ref| max {gap.max():.4f} mean {gap.mean():.4f}; "
          f"|vLLM - unquantized ref| max {control.max():.4f} mean {control.mean():.4f}")
    assert gap.max() <= TOL
    assert control.mean() > 2 * gap.mean()


def test_greedy_tokens_are_the_reference_argmax(arch_run):
    """Up to near-ties: the reference's logprob of each vLLM token is within TOL of its max."""
    _, ids, _, gen, _, _, ref, _ = arch_run
    for step, tok in enumerate(gen):
        row = ref[PROMPT_LEN - 1 + step]
        assert float(row.max() - row[tok]) <= TOL, (step, tok, int(row.argmax()))
