"""Codecs for the speech tests: Mimi at its real shapes (synthetic weights, built once, ~3 s),
and a small Mimi whose receptive field (21 frames) and 16-step window a few dozen frames cross."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.models.speech.codec import load_codec, synthetic_config


def small_config():
    # layer scale 0.5, not Mimi's 0.01 init: the transformer weighs in the audio, so a wrong
    # key, value, position or window in streaming shows as a large error
    return synthetic_config(
        sampling_rate=2400, hidden_size=64, num_filters=8, upsampling_ratios=[4, 3], codebook_size=64,
        codebook_dim=32, vector_quantization_hidden_dimension=32, num_quantizers=8, num_hidden_layers=2,
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, sliding_window=16,
        upsample_groups=64, layer_scale_initial_scale=0.5)


@pytest.fixture(scope="session")
def mimi():
    return load_codec()


@pytest.fixture(scope="session")
def small():
    return load_codec(config=small_config(), seed=1)


@pytest.fixture(scope="session")
def codes_for():
    """``codes_for(codec, batch, frames, seed)``: uniform random codes, the same for a seed."""
    def make(codec, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, codec.facts.codebook_size, (batch, codec.facts.n_q, frames), generator=g)
    return make
