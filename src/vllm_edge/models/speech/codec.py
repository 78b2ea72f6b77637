"""The codec decoder ("code2wav") that turns a talker's codec frames into audio: Kyutai's Mimi,
through transformers' own ``MimiModel``.

No codec weights reach this machine, so ``load_codec()`` without a folder builds Mimi at its
documented shapes (24 kHz, 12.5 frames/s, 1920 samples a frame, codebooks of 2048, an 8-layer
decoder transformer with a 250-step sliding window, a causal SEANet decoder) with seeded random
weights, and says so in ``CodecFacts.source``: every shape, so every timing, is the real
codec's, and the audio is noise. A real Mimi checkpoint folder (``kyutai/mimi``'s
``config.json`` and ``model.safetensors``) goes through the same function and the same
decoding code.

Q = 8 codebooks by default, Moshi's count: the checkpoint's config says ``num_quantizers`` 32,
but ``MimiModel.decode`` sums whichever leading codebooks it is given (the first is the
semantic one, the rest acoustic), so decoding with the first 8 is what Moshi does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import MimiConfig, MimiModel
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiConvTranspose1d,
    MimiEuclideanCodebook,
    MimiResnetBlock,
)

MOSHI_N_Q = 8
# The synthetic codec's output level, as RMS of full scale (-20 dBFS): random SEANet weights
# give an RMS near 3, which PCM16 would clip to a square wave.
SYNTHETIC_RMS = 0.1


@dataclass(frozen=True)
class CodecFacts:
    """What a caller of the codec needs to size chunks, buffers and latencies.

    The receptive field is the number of earlier frames that can change a frame's audio, the
    left context that a stateless chunk (re-decode the previous frames, drop their audio)
    needs to be exact. It has two parts, read from the modules (``_history``):
    ``conv_history_frames``, the causal convolutions (the 2x upsample and the SEANet decoder:
    each causal conv adds (effective kernel - 1) input steps, each transposed conv
    floor((kernel - 1) / stride), converted to samples at its rate and summed), and
    ``transformer_history_frames``, each of the decoder transformer's layers looking
    ``sliding_window - 1`` steps back (steps at the transformer's rate, 2 a frame for Mimi),
    which stack over the layers. The conv part is exact: at Mimi's shapes the stateless
    route's error drops by three orders of magnitude between 4 and 5 frames of context.
    """

    sample_rate: int
    frame_rate: float
    samples_per_frame: int
    n_q: int
    codebook_size: int
    transformer_steps_per_frame: int
    sliding_window: int  # in transformer steps, not frames
    conv_history_frames: int
    transformer_history_frames: int
    source: str  # "synthetic: ..." or the checkpoint folder

    @property
    def receptive_field_frames(self) -> int:
        return self.conv_history_frames + self.transformer_history_frames

    @property
    def synthetic(self) -> bool:
        return self.source.startswith("synthetic")


class Codec:
    """A loaded Mimi and its facts. Decoding runs in float32 under inference mode; one
    ``decode`` of all frames is the reference that any streaming of the same frames must match.
    """

    def __init__(self, model: MimiModel, n_q: int, source: str):
        cfg = model.config
        if not 1 <= n_q <= cfg.num_quantizers:
            raise ValueError(f"n_q={n_q}: this Mimi has {cfg.num_quantizers} codebooks")
        if model.upsample is None:
            raise ValueError("a Mimi whose frame rate equals its SEANet rate (no upsample) is not supported")
        self.model = model.float().eval()
        spf = round(cfg.sampling_rate / cfg.frame_rate)
        steps = int(cfg.encodec_frame_rate / cfg.frame_rate)
        conv_samples = _history(model)
        window = int(cfg.sliding_window)
        self.facts = CodecFacts(
            sample_rate=int(cfg.sampling_rate), frame_rate=float(cfg.frame_rate), samples_per_frame=spf,
            n_q=n_q, codebook_size=int(cfg.codebook_size), transformer_steps_per_frame=steps,
            sliding_window=window, conv_history_frames=math.ceil(conv_samples / spf),
            transformer_history_frames=math.ceil(cfg.num_hidden_layers * (window - 1) / steps),
            source=source)

    def check_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, Q, F]`` integer codes of this codec, as int64 (what the embedding lookup takes);
        anything else raises here rather than deep inside the model."""
        f = self.facts
        if codes.dim() != 3 or codes.shape[1] != f.n_q:
            raise ValueError(f"codes must be [B, {f.n_q}, F], got {list(codes.shape)}")
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise TypeError(f"codes must be integers, got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= f.codebook_size):
            raise ValueError(f"codes must lie in [0, {f.codebook_size})")
        return codes.to(torch.int64)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """All frames at once: ``[B, Q, F]`` -> float32 audio ``[B, F * samples_per_frame]``."""
        codes = self.check_codes(codes)
        with torch.inference_mode():
            audio = self.model.decode(codes, return_dict=False)[0]
        return audio[:, 0].float()


def synthetic_config(**overrides) -> MimiConfig:
    """Mimi's documented shapes (``MimiConfig``'s defaults are ``kyutai/mimi``'s); overrides
    make the small codecs that tests use."""
    return MimiConfig(**overrides)


def load_codec(checkpoint: str | Path | None = None, *, seed: int = 0, config: MimiConfig | None = None,
               n_q: int = MOSHI_N_Q) -> Codec:
    """A real Mimi checkpoint folder, or (``checkpoint=None``) the synthetic codec: ``config``
    (Mimi's shapes by default) with weights drawn from ``seed``, so the same seed gives the
    same codec in every process.

    Two things differ from a plain ``MimiModel(config)``: its codebooks are initialised to
    zeros (every code would decode to the same audio), so they are drawn from a unit normal;
    and the last convolution is scaled so that random codes decode at ``SYNTHETIC_RMS``.
    """
    if checkpoint is not None:
        path = Path(checkpoint)
        model = MimiModel.from_pretrained(path, dtype=torch.float32)
        return Codec(model, n_q, str(path))
    config = config or synthetic_config()
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = MimiModel(config)
        for module in model.quantizer.modules():
            if isinstance(module, MimiEuclideanCodebook):
                module.embed_sum.normal_()
                module.cluster_usage.fill_(1.0)
                module._embed = None  # the codebook caches embed_sum / cluster_usage on first use
        codec = Codec(model, n_q, f"synthetic: MimiConfig shapes, seeded random weights (seed {seed})")
        probe = torch.randint(0, config.codebook_size, (1, n_q, 25))
    finally:
        torch.random.set_rng_state(gen_state)
    rms = float(codec.decode(probe).pow(2).mean().sqrt())
    last = model.decoder.layers[-1].conv
    with torch.no_grad():
        last.weight.mul_(SYNTHETIC_RMS / rms)
        if last.bias is not None:
            last.bias.mul_(SYNTHETIC_RMS / rms)
    return codec


def _history(model: MimiModel) -> int:
    """Samples (at the output rate) of causal-convolution history behind one output sample:
    the 2x upsample, then the SEANet decoder. See ``CodecFacts``."""
    cfg = model.config
    spf = cfg.sampling_rate / cfg.frame_rate
    total = 0.0
    # the upsample's input is at the frame rate
    total += _layer_history(model.upsample, spf)
    step = spf / model.upsample.conv.stride[0]  # output samples per transformer step
    for layer in model.decoder.layers:
        if isinstance(layer, MimiConvTranspose1d):
            total += _layer_history(layer, step)
            step /= layer.conv.stride[0]
        elif isinstance(layer, MimiConv1d):
            total += _layer_history(layer, step)
        elif isinstance(layer, MimiResnetBlock):
            for sub in (*layer.block, layer.shortcut):
                if isinstance(sub, MimiConv1d):
                    total += _layer_history(sub, step)
    return math.ceil(total)


def _layer_history(layer, samples_per_input_step: float) -> float:
    conv = layer.conv
    if isinstance(layer, MimiConvTranspose1d):
        # output t reads inputs i with 0 <= t - i*stride < kernel: floor((kernel - 1) / stride) back
        steps = (conv.kernel_size[0] - 1) // conv.stride[0]
    else:
        steps = (conv.kernel_size[0] - 1) * conv.dilation[0]
    return steps * samples_per_input_step
