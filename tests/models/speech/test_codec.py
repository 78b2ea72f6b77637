"""The codec wrapper: Mimi's documented facts, decode's contract, and a checkpoint folder
loading through the same function as the synthetic codec."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.models.speech.codec import SYNTHETIC_RMS, load_codec

from .conftest import small_config


def test_real_shapes_facts(mimi):
    f = mimi.facts
    assert (f.sample_rate, f.frame_rate, f.samples_per_frame) == (24000, 12.5, 1920)
    assert (f.n_q, f.codebook_size, f.sliding_window, f.transformer_steps_per_frame) == (8, 2048, 250, 2)
    # upsample 1 frame + SEANet 7156 samples = 9076 samples -> 5 frames; 8 layers x 249 steps / 2
    assert (f.conv_history_frames, f.transformer_history_frames) == (5, 996)
    assert f.receptive_field_frames == 1001
    assert f.synthetic and "seeded random" in f.source
    assert mimi.model.config.num_quantizers == 32  # decode takes the first n_q of them


def test_decode_shape_dtype_level(mimi, codes_for):
    audio = mimi.decode(codes_for(mimi, 2, 6))
    assert audio.shape == (2, 6 * 1920) and audio.dtype == torch.float32
    rms = float(audio.pow(2).mean().sqrt())
    assert SYNTHETIC_RMS / 2 < rms < SYNTHETIC_RMS * 2  # PCM16 would not clip it


def test_same_seed_same_codec(small, codes_for):
    codes = codes_for(small, 1, 10)
    again = load_codec(config=small_config(), seed=1)
    other = load_codec(config=small_config(), seed=2)
    assert torch.equal(small.decode(codes), again.decode(codes))
    assert not torch.allclose(small.decode(codes), other.decode(codes))


def test_codes_are_checked(small, codes_for):
    codes = codes_for(small, 1, 4)
    with pytest.raises(ValueError, match="codes must be"):
        small.decode(codes[:, :7])
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        small.decode(codes + 64)
    with pytest.raises(TypeError):
        small.decode(codes.float())


def test_different_codes_different_audio(small, codes_for):
    """Mimi's own init leaves every codebook at zero, which would decode all codes alike."""
    a, b = codes_for(small, 1, 8, seed=1), codes_for(small, 1, 8, seed=2)
    assert not torch.allclose(small.decode(a), small.decode(b))


def test_checkpoint_folder_drops_in(small, codes_for, tmp_path):
    small.model.save_pretrained(tmp_path / "mimi")
    loaded = load_codec(tmp_path / "mimi")
    assert not loaded.facts.synthetic and loaded.facts.source == str(tmp_path / "mimi")
    assert loaded.facts.receptive_field_frames == small.facts.receptive_field_frames
    codes = codes_for(small, 1, 12)
    torch.testing.assert_close(loaded.decode(codes), small.decode(codes), rtol=0, atol=1e-6)
