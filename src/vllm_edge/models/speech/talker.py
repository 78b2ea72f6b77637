"""The talker: a Llama checkpoint whose every decode step emits one codec frame (all ``n_q``
codebook codes of it), built offline around the embedded SmolLM2-135M.

The checkpoint (:func:`build`):

- Body: SmolLM2's real weights (``model.*``).
- Vocabulary, ``V`` rows of the input embedding: the tokenizer's text tokens, then the added
  special tokens (one ``<|voice_NAME|>`` per voice and ``<|speech|>``, which opens the audio),
  padding to a multiple of 64, then ``n_q * codebook_size`` codec tokens (codebook ``q``'s code
  ``c`` is ``codec_offset + q * codebook_size + c``), then end-of-speech, then padding.
- Head (``lm_head.weight``, untied): only the rows from ``codec_offset`` on, ``head_rows`` of
  them, one block of ``codebook_size`` rows per codebook plus end-of-speech. No text rows: the
  talker never generates text, and a full-vocabulary head would be 4x the work per step.
- Weights not in SmolLM2 (the codec and added-token embedding rows, the head) are SEEDED
  RANDOM at the spread of SmolLM2's own embedding, and the config says so
  (``synthetic_weights: true``): the codes are noise, the machinery and its timings are real.
  The end-of-speech head row is zero, so with these weights it never wins and an utterance
  ends at its frame bound (:func:`max_frames`); a trained row would end it.

``config.json`` carries the speech facts under ``vllm_edge_speech`` (:class:`TalkerSpec`), and
``architectures`` names :data:`ARCHITECTURE`, the vLLM model class the plugin registers
(:mod:`.talker_model`). That class picks every codebook's code greedily from the head in one
step, and hands vLLM logits that are -inf except at those ``n_q`` codes, valued
``0, -1, ..., -(n_q - 1)`` by codebook: at temperature 0 vLLM samples codebook 0's code (fed
back as the next input) and ``logprobs=n_q`` returns all ``n_q`` codes in codebook order in the
same step. :func:`sampling_params` asks for exactly that; :func:`frames` reads the codes back.

Public API: :data:`MIMI`, :class:`CodecShape`, :class:`TalkerSpec`, :func:`spec_of`,
:func:`build`, :func:`prepare`, :func:`prepare_quantized`, :func:`prompt`, :func:`max_frames`,
:func:`sampling_params`, :func:`frames` / :class:`Frames`, :func:`choose`, :func:`step_logits`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_edge import envs
from vllm_edge.common import atomic, manifest
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.registration import Registration
from vllm_edge.quant import formats
from vllm_edge.quant.groups import DEFAULT_GROUP

CONVERTER_VERSION = "talker/1"
KIND = CONVERTER_VERSION.split("/")[0]
KEY = "talker-135m"
ARCHITECTURE = "EdgeTalkerForCausalLM"
MODEL_CLASS = "vllm_edge.models.speech.talker_model:EdgeTalkerForCausalLM"
CONFIG_KEY = "vllm_edge_speech"
VOCAB_MULTIPLE = 64
SPEECH_TOKEN = "<|speech|>"
VOICES = ("alba", "brook", "cedar", "dune")
# What the next step sees of a frame: vLLM feeds back one sampled token, codebook 0's code
# (Mimi's semantic codebook); the other codebooks reach later frames only through it.
FEEDBACK = "codebook0"
# The frame bound: room for speech as slow as this, plus a fixed lead-in. English is read at
# about 14 characters a second; 8 leaves a trained talker room to pause.
SLOW_CHARS_PER_SECOND = 8.0
LEAD_SECONDS = 1.0
FORMATS = (formats.DEFAULT,)  # the weight formats a talker build is made and tested in
logger = logging.getLogger("vllm_edge.models")


class TalkerError(EdgeError, ValueError):
    """A talker input, config or output vllm-edge cannot use, named."""


@dataclass(frozen=True)
class CodecShape:
    """The codec the talker speaks: its name, frames per second, codebooks per frame and
    codes per codebook."""
    name: str = "mimi"
    frame_rate: float = 12.5
    n_q: int = 8
    codebook_size: int = 2048

    def validate(self) -> None:
        if self.n_q < 1 or self.codebook_size < 2 or not self.frame_rate > 0:
            raise TalkerError(f"codec shape needs n_q >= 1, codebook_size >= 2 and a positive "
                              f"frame_rate, got {self}")


MIMI = CodecShape()  # Kyutai's Mimi: 12.5 frames/s, 8 codebooks of 2048


def _pad(n: int) -> int:
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


@dataclass(frozen=True)
class TalkerSpec:
    """The ``vllm_edge_speech`` block of a talker's ``config.json``: how token ids map to codes."""
    codec: str
    frame_rate: float
    n_q: int
    codebook_size: int
    text_vocab: int      # tokens the tokenizer knows (text, voices, <|speech|>)
    codec_offset: int    # id of codebook 0's code 0; the head's row 0
    end_id: int          # end-of-speech
    head_rows: int       # rows of lm_head: ids codec_offset .. codec_offset + head_rows - 1
    vocab: int           # rows of the input embedding (config vocab_size)
    speech_start_id: int
    voices: dict[str, int] = field(default_factory=dict)
    feedback: str = FEEDBACK
    synthetic_weights: bool = True

    @classmethod
    def layout(cls, codec: CodecShape, text_vocab: int, voices: dict[str, int],
               speech_start_id: int, synthetic_weights: bool = True) -> TalkerSpec:
        codes = codec.n_q * codec.codebook_size
        offset = _pad(text_vocab)
        head_rows = _pad(codes + 1)
        return cls(codec=codec.name, frame_rate=codec.frame_rate, n_q=codec.n_q,
                   codebook_size=codec.codebook_size, text_vocab=text_vocab, codec_offset=offset,
                   end_id=offset + codes, head_rows=head_rows, vocab=offset + head_rows,
                   speech_start_id=speech_start_id, voices=dict(voices),
                   synthetic_weights=synthetic_weights)

    @classmethod
    def from_config(cls, block: Any, where: str = "config.json") -> TalkerSpec:
        """The block checked: every field present with its type, and a consistent layout."""
        if not isinstance(block, dict):
            raise TalkerError(f"{where}: field {CONFIG_KEY} is missing or not an object; "
                              "not a talker checkpoint")
        kw: dict[str, Any] = {}
        for f in cls.__dataclass_fields__.values():
            if f.name not in block:
                if f.name in ("feedback", "synthetic_weights"):
                    continue
                raise TalkerError(f"{where}: field {CONFIG_KEY}.{f.name} is missing")
            kw[f.name] = block[f.name]
        for name in ("n_q", "codebook_size", "text_vocab", "codec_offset", "end_id", "head_rows",
                     "vocab", "speech_start_id"):
            if isinstance(kw[name], bool) or not isinstance(kw[name], int) or kw[name] < 0:
                raise TalkerError(f"{where}: field {CONFIG_KEY}.{name}={kw[name]!r}; expected a "
                                  "non-negative integer")
        voices = kw["voices"]
        if not isinstance(voices, dict) or not all(isinstance(v, int) for v in voices.values()):
            raise TalkerError(f"{where}: field {CONFIG_KEY}.voices={voices!r}; expected an object "
                              "of voice name -> token id")
        spec = cls(**kw)
        want = cls.layout(CodecShape(spec.codec, spec.frame_rate, spec.n_q, spec.codebook_size),
                          spec.text_vocab, spec.voices, spec.speech_start_id)
        for name in ("codec_offset", "end_id", "head_rows", "vocab"):
            if getattr(spec, name) != getattr(want, name):
                raise TalkerError(f"{where}: field {CONFIG_KEY}.{name}={getattr(spec, name)} does "
                                  f"not match its codec layout (expected {getattr(want, name)})")
        if any(not 0 <= i < spec.text_vocab for i in [*voices.values(), spec.speech_start_id]):
            raise TalkerError(f"{where}: field {CONFIG_KEY}: voice and speech-start ids must be "
                              f"tokenizer ids below text_vocab={spec.text_vocab}")
        return spec

    def to_config(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def codec_shape(self) -> CodecShape:
        return CodecShape(self.codec, self.frame_rate, self.n_q, self.codebook_size)

    def token_id(self, q: int, code: int) -> int:
        return self.codec_offset + q * self.codebook_size + code

    def code_of(self, token_id: int) -> tuple[int, int] | None:
        """(codebook, code) of a codec token id; None for any other id."""
        r = token_id - self.codec_offset
        if not 0 <= r < self.n_q * self.codebook_size:
            return None
        return divmod(r, self.codebook_size)


def spec_of(model_dir: str | Path) -> TalkerSpec:
    """The speech facts of a talker checkpoint (bf16 or quantized)."""
    from vllm_edge.common import model_config

    path = Path(model_dir) / "config.json"
    try:
        cfg = model_config.read(path)
    except model_config.ModelConfigError as exc:
        raise TalkerError(str(exc)) from None
    spec = TalkerSpec.from_config(cfg.get(CONFIG_KEY), where=str(path))
    if cfg.get("vocab_size") != spec.vocab:
        raise TalkerError(f"{path}: field vocab_size={cfg.get('vocab_size')!r}, but "
                          f"{CONFIG_KEY}.vocab={spec.vocab}")
    return spec


# --- the vLLM registration ----------------------------------------------------------------

def register() -> Registration:
    """Register the talker's model class with vLLM, lazily by name (nothing imported until a
    talker checkpoint is loaded). Idempotent."""
    target = "vllm.model_executor.models.registry:ModelRegistry.register_model"
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        if ARCHITECTURE not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
        state = "registered"
    except Exception as exc:  # an upstream API change must be visible, not fatal
        logger.warning("vllm-edge: cannot register model %s: %s", ARCHITECTURE, exc)
        state = f"skipped: {exc}"
    return Registration(name=ARCHITECTURE, kind="model", target=target, state=state)


# --- one step: the heads' choice and the logits vLLM samples from -------------------------

def choose(head_logits: Any, spec: TalkerSpec) -> tuple[Any, Any]:
    """Each codebook's code, greedy (the first index on ties), from the head's logits
    ``[B, head_rows]``: ``codes [B, n_q]`` (int64) and ``ended [B]`` (bool: end-of-speech scores
    above codebook 0's best code, as if it were one more code of codebook 0)."""
    n = spec.n_q * spec.codebook_size
    blocks = head_logits[:, :n].reshape(-1, spec.n_q, spec.codebook_size)
    codes = blocks.argmax(dim=-1)
    ended = head_logits[:, n] > blocks[:, 0].amax(dim=-1)
    return codes, ended


def step_logits(codes: Any, ended: Any, spec: TalkerSpec) -> Any:
    """The ``[B, vocab]`` float32 logits that carry a frame through vLLM's sampler: -inf but
    at codebook ``q``'s chosen code, valued ``-q``; a row that ended holds end-of-speech
    alone, at 0."""
    import torch

    b = codes.shape[0]
    out = torch.full((b, spec.vocab), float("-inf"), dtype=torch.float32, device=codes.device)
    base = spec.codec_offset + spec.codebook_size * torch.arange(spec.n_q, device=codes.device)
    rank = -torch.arange(spec.n_q, dtype=torch.float32, device=codes.device)
    out.scatter_(1, codes + base, rank.expand(b, -1).contiguous())
    if bool(ended.any()):
        out[ended] = float("-inf")
        out[ended, spec.end_id] = 0.0
    return out


# --- the request ----------------------------------------------------------------------------

def prompt(text: str, voice: str, tokenizer: Any, spec: TalkerSpec) -> dict[str, list[int]]:
    """vLLM's tokens prompt for ``text`` in ``voice``: ``<|voice_NAME|> text <|speech|>``
    (``tokenizer`` is the checkpoint's; text tokens without BOS or chat template)."""
    if voice not in spec.voices:
        raise TalkerError(f"unknown voice {voice!r}; this talker has {', '.join(sorted(spec.voices))}")
    if not text or not text.strip():
        raise TalkerError("nothing to say: the text is empty")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return {"prompt_token_ids": [spec.voices[voice], *ids, spec.speech_start_id]}


def max_frames(text: str, spec: TalkerSpec, cap: int | None = None) -> int:
    """The frame bound of ``text``: speech at :data:`SLOW_CHARS_PER_SECOND` plus
    :data:`LEAD_SECONDS`, at the codec's frame rate (at most ``cap``). A bound, not a duration:
    a trained talker ends earlier with end-of-speech."""
    n = math.ceil(spec.frame_rate * (LEAD_SECONDS + len(text) / SLOW_CHARS_PER_SECOND))
    return max(1, min(n, cap) if cap else n)


def sampling_params(spec: TalkerSpec, frames_max: int, **overrides: Any) -> Any:
    """vLLM ``SamplingParams`` for one utterance: greedy, ``logprobs=n_q`` (every code of every
    frame, raw logprobs, vLLM's default mode), stop at end-of-speech, at most ``frames_max``
    frames, no detokenizing (codec ids are not text). ``overrides`` go to SamplingParams (e.g.
    ``output_kind`` for streaming); temperature, penalties and logprobs must stay as set."""
    from vllm import SamplingParams

    kw: dict[str, Any] = {"temperature": 0.0, "max_tokens": frames_max, "logprobs": spec.n_q,
                          "stop_token_ids": [spec.end_id], "detokenize": False,
                          "skip_special_tokens": False}
    kw.update(overrides)
    return SamplingParams(**kw)


# --- reading frames back -------------------------------------------------------------------

@dataclass
class Frames:
    """Frames read from a talker's output: ``codes`` is ``[n_q, F]`` int64, ``ended`` says
    end-of-speech was sampled, ``steps`` how many generated tokens were read."""
    codes: Any
    ended: bool
    steps: int


def _logprob(v: Any) -> float:
    return float(getattr(v, "logprob", v))


def step_codes(token_id: int, logprobs: dict[int, Any], spec: TalkerSpec,
               step: int = 0) -> list[int] | None:
    """The ``n_q`` codes of one step, in codebook order, from the sampled token and its
    returned logprobs; None when the step sampled end-of-speech."""
    if token_id == spec.end_id:
        return None
    found: dict[int, tuple[int, float]] = {}
    for tid, v in logprobs.items():
        lp = _logprob(v)
        if not math.isfinite(lp):
            continue
        qc = spec.code_of(int(tid))
        if qc is None:
            raise TalkerError(f"step {step}: token {tid} has a finite logprob but is not a codec "
                              "token; is this a talker checkpoint?")
        if qc[0] in found:
            raise TalkerError(f"step {step}: two codes for codebook {qc[0]}")
        found[qc[0]] = (qc[1], lp)
    if len(found) != spec.n_q:
        raise TalkerError(f"step {step}: the logprobs hold codes of {len(found)} of {spec.n_q} "
                          f"codebooks; request logprobs={spec.n_q} (sampling_params does)")
    if sorted(found, key=lambda q: -found[q][1]) != list(range(spec.n_q)):
        raise TalkerError(f"step {step}: the codes are not ranked in codebook order")
    if spec.code_of(int(token_id)) != (0, found[0][0]):
        raise TalkerError(f"step {step}: the sampled token {token_id} is not codebook 0's code; "
                          "a talker samples at temperature 0 without penalties")
    return [found[q][0] for q in range(spec.n_q)]


def frames(output: Any, spec: TalkerSpec, start: int = 0) -> Frames:
    """The frames of a vLLM ``CompletionOutput`` from its ``start``-th generated token on (a
    streamed request: pass each delta output with ``start=0``, or a cumulative one with the
    steps read so far). Reading stops at end-of-speech."""
    import torch

    ids = list(output.token_ids)[start:]
    lps = output.logprobs
    if ids and lps is None:
        raise TalkerError(f"the output has no logprobs; request logprobs={spec.n_q} (sampling_params does)")
    lps = list(lps)[start:] if lps is not None else []
    if len(lps) < len(ids):
        raise TalkerError(f"the output has {len(ids)} tokens but logprobs for {len(lps)}")
    rows: list[list[int]] = []
    ended, steps = False, 0
    for i, (tid, lp) in enumerate(zip(ids, lps)):
        steps += 1
        codes = step_codes(tid, lp, spec, step=start + i)
        if codes is None:
            ended = True
            break
        rows.append(codes)
    codes_t = (torch.tensor(rows, dtype=torch.int64).T.contiguous() if rows
               else torch.empty((spec.n_q, 0), dtype=torch.int64))
    return Frames(codes=codes_t, ended=ended, steps=steps)


# --- the build ------------------------------------------------------------------------------

def voice_token(name: str) -> str:
    return f"<|voice_{name}|>"


def _save_tokenizer(tmp: Path, src: Path, voices: Sequence[str]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    base = len(tok)
    new = [*(voice_token(v) for v in voices), SPEECH_TOKEN]
    added = tok.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    ids = {t: tok.convert_tokens_to_ids(t) for t in new}
    if added != len(new) or sorted(ids.values()) != list(range(base, base + len(new))):
        raise TalkerError(f"{src}: the tokenizer already has some of {new}; expected new ids from {base}")
    tok.save_pretrained(str(tmp))
    return {"base": base, "tokens": len(tok), "speech_start_id": ids[SPEECH_TOKEN],
            "voices": {v: ids[voice_token(v)] for v in voices}}


def build(out: str | Path, *, text_dir: str | Path, codec: CodecShape = MIMI,
          voices: Sequence[str] = VOICES, seed: int = 0, force: bool = False) -> Path:
    """Write the bf16 talker checkpoint around the Llama checkpoint ``text_dir`` to ``out``
    (atomically; an existing ``out`` that is not a talker build is refused unless ``force``);
    returns ``out``."""
    import torch
    from safetensors.torch import save_file

    from vllm_edge.common import model_config
    from vllm_edge.quant.quantize import load_ref, tensor_refs

    codec.validate()
    if not voices or len(set(voices)) != len(voices):
        raise TalkerError(f"voices must be distinct names, at least one: {list(voices)}")
    out, src = Path(out).expanduser(), Path(text_dir)
    text_cfg = model_config.read(src / "config.json")
    if text_cfg.get("model_type") != "llama":
        raise TalkerError(f"{src / 'config.json'}: field model_type={text_cfg.get('model_type')!r}; "
                          "the talker is built on a Llama checkpoint")
    gen = torch.Generator().manual_seed(seed)
    with atomic.directory(out, kind=KIND, inputs=[src], force=force) as tmp:
        tok = _save_tokenizer(tmp, src, voices)
        spec = TalkerSpec.layout(codec, tok["tokens"], tok["voices"], tok["speech_start_id"])
        tensors: dict[str, torch.Tensor] = {}
        for name, ref in tensor_refs(src):
            if name == "lm_head.weight":
                continue  # the talker's head is its own (codec rows only)
            if not name.startswith("model."):
                raise TalkerError(f"{ref[0]}: unexpected tensor {name}")
            tensors[name] = load_ref(ref)
        emb = tensors["model.embed_tokens.weight"]
        if emb.shape[0] != tok["base"]:
            raise TalkerError(f"{src}: embedding has {emb.shape[0]} rows but the tokenizer "
                              f"{tok['base']} tokens")
        hidden = emb.shape[1]
        ef = emb.float()
        mean, std = ef.mean(0, keepdim=True), float(ef.std())

        def rand(rows: int) -> torch.Tensor:
            return mean + torch.randn((rows, hidden), generator=gen) * std

        n_codes = spec.n_q * spec.codebook_size
        rows = torch.cat([
            ef,
            rand(tok["tokens"] - tok["base"]),               # voices and <|speech|>
            mean.expand(spec.codec_offset - tok["tokens"], -1),  # padding
            rand(n_codes),                                   # codec codes, fed back as inputs
            mean.expand(spec.vocab - spec.codec_offset - n_codes, -1),  # end-of-speech, padding
        ])
        tensors["model.embed_tokens.weight"] = rows.to(emb.dtype).contiguous()
        # the codec heads at the spread of SmolLM2's own (tied) head rows; end-of-speech and
        # padding rows zero, so neither ever wins a step with these weights
        head = torch.zeros((spec.head_rows, hidden))
        head[:n_codes] = torch.randn((n_codes, hidden), generator=gen) * std
        tensors["lm_head.weight"] = head.to(emb.dtype).contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        cfg = {k: v for k, v in text_cfg.items() if k not in ("_model_name_or_path", "torch_dtype")}
        cfg.update({"architectures": [ARCHITECTURE], "vocab_size": spec.vocab,
                    "tie_word_embeddings": False, "dtype": "bfloat16",
                    CONFIG_KEY: spec.to_config()})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        # transformers' generate stops at end-of-speech too
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": text_cfg.get("bos_token_id"), "eos_token_id": spec.end_id,
             "pad_token_id": text_cfg.get("pad_token_id")}, indent=2) + "\n")
        text_manifest = manifest.read(src)
        manifest.write(tmp, {
            "converter": CONVERTER_VERSION, "source": str(src),
            "source_sha256": text_manifest.get("source_sha256"),
            "text_converter": text_manifest.get("converter"),
            "seed": seed, "codec": asdict(codec), "voices": list(voices),
            "synthetic": "codec and added-token embedding rows, lm_head", "init_std": std,
            "dtype": "bfloat16",
        })
    return out


# --- the cached builds ----------------------------------------------------------------------

def prepared_dir() -> Path:
    return envs.home() / "models" / f"{KEY}-bf16"


def quantized_dir(scheme: str, group: int = DEFAULT_GROUP) -> Path:
    return envs.home() / "models" / f"{KEY}-{scheme}-g{group}"


def _text(text: str | Path | None) -> Path:
    if text is None:  # the store passes the converted embedded model (store.prepare_talker)
        raise TalkerError("a talker is built around a Llama checkpoint: pass text=, or build the "
                          "embedded one with store.prepare_talker")
    return Path(text)


def prepare(text: str | Path | None = None, *, force: bool = False) -> Path:
    """The default talker (Mimi's shape, :data:`VOICES`, seed 0) around the converted embedded
    model (or the Llama checkpoint ``text``), built once and cached under ``VLLM_EDGE_HOME``
    by its source's content and the converter."""
    src = _text(text)
    out = prepared_dir()
    want = {"converter": CONVERTER_VERSION, "source_sha256": manifest.read(src).get("source_sha256"),
            "codec": asdict(MIMI), "voices": list(VOICES), "seed": 0}
    return atomic.build_once(out, want, lambda: build(out, text_dir=src, force=force),
                             force=force, log=logger, redo="building the talker again")


def prepare_quantized(scheme: str = formats.DEFAULT, group: int = DEFAULT_GROUP, *,
                      text: str | Path | None = None, force: bool = False,
                      progress: bool = False) -> Path:
    """The default talker in ``scheme`` (one of :data:`FORMATS`), once: the body and input
    embedding quantized, the codec head kept bf16 (its argmax picks the codes; 19 MB)."""
    from vllm_edge.quant.quantize import CONVERTER_VERSION as QV
    from vllm_edge.quant.quantize import quantize_model

    if scheme not in FORMATS:
        raise TalkerError(f"the talker is built in {' or '.join(FORMATS)} (or bf16), not {scheme!r}")
    bf16 = prepare(text)
    out = quantized_dir(scheme, group)
    want = {"source": str(bf16), "source_sha256": manifest.read(bf16).get("source_sha256"),
            "converter": f"{QV}+{CONVERTER_VERSION}", "scheme": scheme, "group_size": group}
    return atomic.build_once(out, want, lambda: quantize_model(
        bf16, out, scheme=scheme, group=group, modules_to_not_convert=["lm_head"],
        progress=progress, manifest=want, force=force),
        force=force, log=logger, redo="quantizing the talker again")
