"""The talker on vLLM's engine (bf16, then its cpu_int4 build): every engine step streams one
codec frame of n_q codes, and the codes are what the checkpoint's own heads choose, checked
against transformers running the same weights teacher-forced on the tokens vLLM fed back.

Printed observations: decode frames per second at batch 1 (real time is 12.5)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from vllm_edge.models.speech import talker

pytestmark = pytest.mark.slow

REQUESTS = [("Hello there, this is the talker speaking.", "alba"), ("Good morning.", "dune")]
FRAMES = 24
# bf16 logits near 20 are spaced 0.125 apart, and vLLM's kernels round differently from
# transformers': a code may differ only where the reference's best two codes are this close
MARGIN = 0.5


def _stream(llm, spec):
    """Each request alone (batch 1), stepped through vLLM's engine with delta outputs:
    per request, the frames each step gave, the tokens vLLM fed back and the seconds."""
    from vllm.sampling_params import RequestOutputKind

    tok, eng, runs = llm.get_tokenizer(), llm.llm_engine, []
    params = talker.sampling_params(spec, FRAMES, output_kind=RequestOutputKind.DELTA)
    for i, (text, voice) in enumerate(REQUESTS):
        prompt = talker.prompt(text, voice, tok, spec)
        eng.add_request(f"talk-{i}", prompt, params)
        steps, fed, seconds = [], [], []
        while eng.has_unfinished_requests():
            t0 = time.perf_counter()
            outs = eng.step()
            seconds.append(time.perf_counter() - t0)
            for o in outs:
                steps.append(talker.frames(o.outputs[0], spec).codes)
                fed += list(o.outputs[0].token_ids)
        runs.append({"prompt": prompt["prompt_token_ids"], "steps": steps, "fed": fed,
                     "seconds": seconds})
    methods = llm.apply_model(lambda m: (
        sorted({type(x.quant_method).__name__ for x in m.modules() if getattr(x, "quant_method", None)}),
        type(m.lm_head.quant_method).__name__))[0]
    return runs, methods


def _engine(run_llm, model_dir):
    spec = talker.spec_of(model_dir)
    return run_llm(lambda llm: _stream(llm, spec), model=str(model_dir), enforce_eager=True,
                   max_model_len=256, kv_cache_memory_bytes=64 << 20, dtype="bfloat16", seed=0)


@pytest.fixture(scope="module")
def bf16_dir(default_model_dir):
    return talker.prepare(default_model_dir)


@pytest.fixture(scope="module")
def bf16_run(bf16_dir, run_llm):
    return _engine(run_llm, bf16_dir)


@pytest.fixture(scope="module")
def int4_run(bf16_dir, default_model_dir, run_llm):
    return _engine(run_llm, talker.prepare_quantized("cpu_int4", text=default_model_dir))


@pytest.fixture(scope="module")
def reference(bf16_dir):
    """``head(prompt, fed)``: the bf16 checkpoint's head logits (float32, from transformers'
    bf16 hidden states) at every frame, teacher-forced on the tokens an engine fed back."""
    from safetensors import safe_open
    from transformers import LlamaModel

    model = LlamaModel.from_pretrained(str(bf16_dir), dtype=torch.bfloat16).eval()
    with safe_open(str(bf16_dir / "model.safetensors"), framework="pt") as h:
        w = h.get_tensor("lm_head.weight").float()

    def head(prompt, fed):
        ids = torch.tensor([prompt + fed[:-1]])  # the last frame's token is never an input
        with torch.no_grad():
            hidden = model(ids).last_hidden_state[0, len(prompt) - 1:]
        return hidden.float() @ w.T

    return head


def _compare(run, head, spec):
    """Engine codes against the reference's greedy choice, and the reference's margin
    (best minus second best) at every code."""
    logits = head(run["prompt"], run["fed"])
    want, _ = talker.choose(logits, spec)
    blocks = logits[:, :spec.n_q * spec.codebook_size].view(-1, spec.n_q, spec.codebook_size)
    top2 = blocks.topk(2, dim=-1).values
    got = torch.cat(run["steps"], dim=1)
    return got, want.T, (top2[..., 0] - top2[..., 1]).T


def _fps(runs) -> str:
    """Decode frames per second (the first step holds the prefill): from the median step,
    which a shared host's stalls do not move, and from the mean."""
    steps = [s for r in runs for s in r["seconds"][1:]]
    return (f"{1 / statistics.median(steps):.1f} frames/s decode from the median step, "
            f"{len(steps) / sum(steps):.1f} from the mean")


def test_each_engine_step_streams_one_frame_of_every_codebook(bf16_run, bf16_dir):
    runs, _ = bf16_run
    spec = talker.spec_of(bf16_dir)
    for r in runs:
        assert len(r["steps"]) == FRAMES == len(r["fed"])  # never ends itself: zero end row
        for codes in r["steps"]:
            assert codes.shape == (spec.n_q, 1)
            assert 0 <= int(codes.min()) and int(codes.max()) < spec.codebook_size
        fed0 = [spec.code_of(t) for t in r["fed"]]
        assert fed0 == [(0, int(c[0, 0])) for c in r["steps"]]  # codebook 0 fed back
    # the voices and texts give different streams
    assert not torch.equal(torch.cat(runs[0]["steps"], 1), torch.cat(runs[1]["steps"], 1))
    print(f"talker bf16 eager, batch 1: {_fps(runs)} (real time {spec.frame_rate}); "
          f"first step {runs[0]['seconds'][0] * 1e3:.0f} ms")


def test_the_codes_are_what_the_heads_choose(bf16_run, bf16_dir, reference):
    runs, (_, head_method) = bf16_run
    spec = talker.spec_of(bf16_dir)
    assert head_method == "UnquantizedEmbeddingMethod"
    total = same = 0
    for r in runs:
        got, want, margin = _compare(r, reference, spec)
        differ = got != want
        assert not (differ & (margin > MARGIN)).any(), \
            f"codes differ where the reference's margin exceeds {MARGIN}: {margin[differ].tolist()}"
        total, same = total + got.numel(), same + int((~differ).sum())
        print(f"bf16 engine vs transformers: {int((~differ).sum())}/{got.numel()} codes equal, "
              f"first frame {'equal' if not differ[:, 0].any() else 'differs'}; margins where "
              f"they differ {margin[differ].tolist()}")
    assert same >= 0.95 * total


def test_the_cpu_int4_build_streams_codes_close_to_bf16(int4_run, bf16_dir, reference):
    runs, (methods, head_method) = int4_run
    spec = talker.spec_of(bf16_dir)
    assert "CpuInt4LinearMethod" in methods and "CpuInt4EmbeddingMethod" in methods
    assert head_method == "UnquantizedEmbeddingMethod"  # the codec head stays bf16
    total = same = 0
    for r in runs:
        assert len(r["steps"]) == FRAMES and all(c.shape == (spec.n_q, 1) for c in r["steps"])
        got, want, _ = _compare(r, reference, spec)
        assert 0 <= int(got.min()) and int(got.max()) < spec.codebook_size
        total, same = total + got.numel(), same + int((got == want).sum())
    # 4-bit weights move the hidden state: measured 66% and 85% on these two requests; chance
    # is 1 in 2048
    print(f"cpu_int4 engine vs bf16 reference (teacher-forced): {same}/{total} codes equal; "
          f"batch 1: {_fps(runs)}")
    assert same >= 0.5 * total
