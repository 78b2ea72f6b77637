"""The VLM on the real engine: vLLM bf16 against transformers bf16 on the same
image and prompt, cpu_int4's first token against bf16's, and `run --image` end to end.

Engines run in their own processes (tests/support/vlm_probe.py and the CLI); transformers
runs here, without torchvision (it is not installed in this venv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli_runner import run_cli
from support.hosts import AMX_NUMERICS, amx_host
from vllm_edge.common.jsonline import last_json_line

pytestmark = pytest.mark.slow

PROMPT = "Write a short story about a cat who finds this picture."
# cpu_int4's first token is checked on a factual question: on PROMPT it opens with "A"
# where bf16 opens with "The" (bf16's margin 0.75 nats), a measured 4-bit flip, not a
# path error (docs/guide/multimodal.md)
INT4_PROMPT = "What is the capital of France?"
SYSTEM = "You are a helpful assistant."
TOKENS = 16
# bf16 keeps 8 significant bits: two logits near 20 can swap order when 0.15 nats apart
NEAR_TIE = 0.15
PROBE = Path(__file__).parents[1] / "support" / "vlm_probe.py"


def make_image(path: Path) -> Path:
    """A deterministic 320x240 picture: a gradient with a bright rectangle."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (320, 240))
    img.putdata([(x * 255 // 319, y * 255 // 239, 128) for y in range(240) for x in range(320)])
    ImageDraw.Draw(img).rectangle((100, 60, 220, 180), fill=(250, 240, 20))
    img.save(path, format="PNG")
    return path


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return make_image(tmp_path_factory.mktemp("img") / "picture.png")


@pytest.fixture(scope="module")
def bf16_dir():
    from vllm_edge.models import store, vlm

    return vlm.prepare(store.prepare("default", progress=False))


@pytest.fixture(scope="module")
def vllm_runs(bf16_dir, image):
    proc = subprocess.run([sys.executable, str(PROBE), str(bf16_dir), str(image),
                           json.dumps([PROMPT, INT4_PROMPT]), SYSTEM, str(TOKENS)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json_line(proc.stdout)["results"]


@pytest.fixture(scope="module")
def vllm_bf16(vllm_runs):
    return vllm_runs[0]


@pytest.fixture(scope="module")
def hf(bf16_dir, image, vllm_bf16):
    """transformers on the same image and prompt, teacher-forced on vLLM's 16 tokens:
    log-probabilities at every step in bf16 and in fp32 compute (same bf16 weights)."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    proc = AutoProcessor.from_pretrained(str(bf16_dir))
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True)
    enc = proc(text=text, images=[Image.open(image).convert("RGB")], return_tensors="pt")
    n = enc["input_ids"].shape[1]
    ids = torch.cat([enc["input_ids"], torch.tensor([vllm_bf16["token_ids"]])], 1)
    out = {"prompt_token_ids": enc["input_ids"][0].tolist()}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model = Idefics3ForConditionalGeneration.from_pretrained(str(bf16_dir), dtype=dtype).eval()
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           pixel_values=enc["pixel_values"],
                           pixel_attention_mask=enc["pixel_attention_mask"]).logits[0]
        out[name] = torch.log_softmax(logits[n - 1:n - 1 + TOKENS].float(), -1)
        del model
    return out


def test_same_prompt_tokens(vllm_bf16, hf, bf16_dir):
    cfg = json.loads((bf16_dir / "config.json").read_text())
    assert vllm_bf16["prompt_token_ids"] == hf["prompt_token_ids"]
    assert vllm_bf16["prompt_token_ids"].count(cfg["image_token_id"]) == 64  # one 512-pixel tile


@pytest.mark.xfail(amx_host(), reason=AMX_NUMERICS, strict=False)
def test_bf16_greedy_16_tokens_are_transformers_argmax(vllm_bf16, hf):
    """vLLM's 16 greedy tokens are transformers' argmax on the same prefix (fp32 compute on
    the bf16 weights: the reference without bf16 rounding), bar at most one near-tie within
    NEAR_TIE nats of it. Measured: 16/16 on AVX-512 CPUs; on an AVX2 EPYC, whose bf16
    products round differently, step 14 takes the second of two tokens 0.11 nats apart in
    fp32. An image-path error moves the tokens by whole nats."""
    toks = vllm_bf16["token_ids"]
    assert len(toks) == TOKENS
    gaps = [float(hf["fp32"][i].max() - hf["fp32"][i, t]) for i, t in enumerate(toks)]
    assert max(gaps) < NEAR_TIE, gaps
    assert sum(g == 0 for g in gaps) >= TOKENS - 1, gaps


@pytest.mark.xfail(amx_host(), reason=AMX_NUMERICS, strict=False)
def test_bf16_greedy_agrees_with_transformers_bf16(vllm_bf16, hf):
    """Against transformers in bf16: vLLM's token is its top-1, or a near-tie within
    2 * NEAR_TIE nats of it (two bf16 roundings apart). Measured: 14/16 exact on AVX-512 CPUs,
    steps 7 and 10 ties of 0.06 and 0.00 nats that fp32 breaks vLLM's way; 15/16 on an AVX2
    EPYC, step 14 0.25 nats (docs/guide/multimodal.md)."""
    lp = hf["bf16"]
    toks = vllm_bf16["token_ids"]
    gaps = [float(lp[i].max() - lp[i, t]) for i, t in enumerate(toks)]
    assert max(gaps) < 2 * NEAR_TIE, gaps
    assert sum(g == 0 for g in gaps) >= TOKENS - 2, gaps


@pytest.mark.xfail(amx_host(), reason=AMX_NUMERICS, strict=False)
def test_bf16_first_token_logprobs_match_transformers(vllm_bf16, hf):
    v = {int(k): lp for k, lp in vllm_bf16["first_logprobs"].items()}
    d32 = [abs(lp - float(hf["fp32"][0, k])) for k, lp in v.items()]
    d16 = [abs(lp - float(hf["bf16"][0, k])) for k, lp in v.items()]
    # bounds with headroom over the gaps observed when this test was written
    assert max(d32) < 0.1, d32
    assert max(d16) < 0.25, d16


def run_cli_json(*args: str) -> dict:
    proc = run_cli("run", "--enforce-eager", "-o", "json", *args, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json_line(proc.stdout)


def run_image(model: str, image: Path) -> dict:
    return run_cli_json("--model", model, "--image", str(image), "--prompt", INT4_PROMPT,
                        "--system", SYSTEM, "--max-tokens", "12")


@pytest.fixture(scope="module")
def int4_run(image):
    # --model default with --image runs the embedded VLM on the chosen 4-bit path
    return run_image("default", image)


@pytest.fixture(scope="module")
def int4_vision_run(image):
    from vllm_edge.models import store, vlm

    text = store.prepare("default", progress=False)
    return run_image(str(vlm.prepare_quantized(text, "cpu_int4", quantize_vision=True, progress=False)), image)


def test_run_image_runs_cpu_int4(int4_run, vllm_runs):
    assert int4_run["weight_path"]["scheme"] == "cpu_int4"
    assert "smolvlm-135m-cpu_int4-g32" in int4_run["model"]
    assert int4_run["images"][0] == {"source": int4_run["images"][0]["source"], "format": "PNG",
                                     "width": 320, "height": 240,
                                     "bytes": int4_run["images"][0]["bytes"]}
    assert int4_run["prompt_tokens"] == len(vllm_runs[1]["prompt_token_ids"])
    assert "Paris" in int4_run["answer"]


def test_quantized_vision_runs(int4_vision_run, vllm_runs):
    assert int4_vision_run["weight_path"]["name"] == "cpu_int4"
    assert "smolvlm-135m-cpu_int4-g32-vision" in int4_vision_run["model"]
    assert "Paris" in int4_vision_run["answer"]


# The first-token criterion on the default (g32) builds: their language model sits on the Q4_1 grid
# the SmolLM2 weights came from (docs/design/cpu-int4.md), and they open like bf16.
@pytest.mark.parametrize("build", ["int4_run", "int4_vision_run"])
def test_cpu_int4_first_token_top1_matches_bf16(build, request, vllm_runs):
    run = request.getfixturevalue(build)
    assert run["token_ids"][0] == vllm_runs[1]["token_ids"][0]


@pytest.fixture(scope="module")
def int4_g64_run(image):
    return run_image("smolvlm-135m-cpu_int4-g64", image)


# The same criterion at g64 (the default until the group grid) is NOT met (docs/guide/multimodal.md):
# it opens with "The capital..." against bf16's "Paris is...", a token bf16 ranks in its top 5.
# The day it matches, this fails and the docs need updating.
def test_cpu_int4_g64_opens_differently_but_within_bf16_top5(int4_g64_run, vllm_runs):
    """Specifically about g64 (not the default group): the documented gap of the faster build."""
    assert "smolvlm-135m-cpu_int4-g64" in int4_g64_run["model"] and "Paris" in int4_g64_run["answer"]
    assert int4_g64_run["token_ids"][0] != vllm_runs[1]["token_ids"][0]
    assert str(int4_g64_run["token_ids"][0]) in vllm_runs[1]["first_logprobs"]


def test_vlm_int4_language_model_is_the_text_model_int4():
    """Without an image the VLM's 4-bit language model answers token for token like the
    embedded text model's 4-bit build (same quantizer on the same SmolLM2 weights; only
    the 64 new vocabulary rows differ), so the VLM adds no error of its own to that path."""
    vlm_res = run_cli_json("--model", "smolvlm-135m-cpu_int4-g32", "--max-tokens", "16")
    text_res = run_cli_json("--model", "default", "--max-tokens", "16")
    assert text_res["weight_path"]["scheme"] == "cpu_int4"
    assert vlm_res["token_ids"] == text_res["token_ids"]
