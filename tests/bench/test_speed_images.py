"""The speed core's image option, with a recording generate (no engine): which prompts
each metric sends, and that every image is new."""

from __future__ import annotations

import pytest

from vllm_edge.bench import speed


def test_image_metrics_and_prompts():
    calls = []

    def generate(prompts, max_tokens):
        calls.append((prompts, max_tokens))
        return 0.5 if max_tokens == 1 else 0.5 + 0.01 * (max_tokens - 1)

    cfg = speed.SpeedConfig(prompt_len=8, tg_tokens=5, reps=2, warmup=False, image_px=24)
    source = speed.TokenSource(list(range(100, 400)))
    images = speed.ImagePrompts(49153, 24, source)
    out = speed.measure(generate, cfg, source, images=images)
    assert set(out["runs"]) == {"pp8_tps", "tg5_tps", "img24_prefill_s", "tg5_img_tps"}
    assert out["runs"]["img24_prefill_s"] == [0.5, 0.5]
    assert out["runs"]["tg5_img_tps"] == pytest.approx([100.0, 100.0])  # 4 tokens / 0.04 s
    mm = [p for ps, _ in calls for p in ps if isinstance(p, dict)]
    assert len(mm) == 2 * 3  # per rep: one prefill, one tg pair
    for p in mm:
        assert p["prompt_token_ids"][0] == 49153 and len(p["prompt_token_ids"]) == 1 + speed.TG_PROMPT_LEN
        assert p["multi_modal_data"]["image"].size == (24, 24)
    pixels = [p["multi_modal_data"]["image"].tobytes() for p in mm]
    assert len(set(pixels)) == len(pixels)  # a new image every call: no encoder-cache hits
    # the tg pair shares its text, so only the decode length differs
    pair = [ps[0] for ps, n in calls if isinstance(ps[0], dict)][1:3]
    assert pair[0]["prompt_token_ids"] == pair[1]["prompt_token_ids"]


def test_image_option_needs_prompts_and_a_vlm(tmp_path):
    cfg = speed.SpeedConfig(prompt_len=8, tg_tokens=5, reps=1, warmup=False, image_px=24)
    with pytest.raises(ValueError, match="no image prompts"):
        speed.measure(lambda p, n: 1.0, cfg, speed.TokenSource(list(range(50))))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(speed.SpeedArgError, match="not a vision-language model"):
        speed.image_token_id(tmp_path)
    with pytest.raises(speed.SpeedArgError, match="--image-px"):
        speed.validate(speed.SpeedConfig(image_px=0))


def test_vlm_keys():
    from vllm_edge.models import vlm

    assert vlm.parse_key("smolvlm-135m") == (None, 64, False)
    assert vlm.parse_key("smolvlm-135m-cpu_int4-g64") == ("cpu_int4", 64, False)
    assert vlm.parse_key("smolvlm-135m-cpu_int4-g128-vision") == ("cpu_int4", 128, True)
    assert vlm.parse_key("smolvlm-135m-cpu_int4-g32") == ("cpu_int4", 32, False)
    assert vlm.parse_key("smolvlm-135m-cpu_int4-g96") is None
    assert vlm.parse_key("smolvlm-135m-gptq-g64") is None
    assert vlm.quantized_dir("cpu_int4", 64, True).name == "smolvlm-135m-cpu_int4-g64-vision"
