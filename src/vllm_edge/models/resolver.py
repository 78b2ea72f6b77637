"""The one resolver: a model argument, read once, becomes one typed source.

``resolve("default")``, ``resolve("smolvlm-135m-cpu_int4-g64")``, ``resolve("model.gguf")`` or
``resolve("./folder")`` says what the argument is (an embedded model, the default VLM, a GGUF
file, a bf16 Hugging Face folder, a quantized folder whose codes a format keeps, or a build
that runs as stored) and nothing more; it builds nothing. Each source then knows:

- :meth:`Source.fit`: what it can become given the weight format the probe chose for this
  CPU (``runtime/weight_path`` picks the format; the source says whether it can be built in
  it, what it becomes instead, and why);
- :meth:`Source.build`: the directory an engine loads, built on first use in a child process
  and cached by content (:mod:`.store`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vllm_edge.models import store
from vllm_edge.models.errors import ModelNotAvailable
from vllm_edge.quant import formats
from vllm_edge.quant.groups import DEFAULT_GROUP


# The embedded speech model's names: 'speech', and the talker's own key.
SPEECH_KEYS = ("speech", "talker-135m")


@dataclass
class Fit:
    """What a source becomes for a chosen format: the format to build (``None``: bf16, or the
    checkpoint as stored), the reasons to print, and whether the choice was replaced."""
    scheme: str | None
    reasons: list[str] = field(default_factory=list)
    fallback: bool = False
    stored: bool = False  # runs as stored: its own checkpoint says what it is


@dataclass(frozen=True)
class Source:
    arg: str

    kind = "source"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        """``scheme``: the format chosen for this CPU (``name``: the weight path's name)."""
        return Fit(scheme)

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        """The directory an engine loads in ``scheme`` (None: bf16, or as stored)."""
        raise NotImplementedError


def _fallback(scheme: str | None, name: str | None, have: list[str], what: str) -> Fit | None:
    """The first format ``what`` has, when the chosen one is not among them."""
    if scheme is None or scheme in have:
        return None
    return Fit(have[0], [f"{what} has no {name or scheme} build; using {have[0]}"], fallback=True)


@dataclass(frozen=True)
class Embedded(Source):
    """'default' or an embedded key: a PyPI package's GGUF, repacked with its own codes for the
    default format at its block width, else converted to bf16 once and quantized in any format
    of the registry."""
    kind = "embedded"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        fit = Fit(scheme)
        if store.keeps_codes(scheme, None):
            fit.reasons.append("the embedded model's GGUF keeps its own codes (its 4-bit blocks as "
                               f"{formats.DEFAULT}, its 8-bit embedding as cpu_int8), as llama.cpp "
                               "runs it; built once (docs/guide/quantize.md)")
        return fit

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        return store.ensure_embedded(self.arg, scheme, group)


@dataclass(frozen=True)
class Vlm(Source):
    """The default VLM: the bare key takes the chosen format, a named build runs as named."""
    named: tuple[str | None, int, bool] = (None, DEFAULT_GROUP, False)
    kind = "vlm"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        from vllm_edge.models import vlm

        return _fallback(scheme, name, vlm.vision_formats(), vlm.KEY) or Fit(scheme)

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        named, named_group, vision = self.named
        if named:
            scheme, group = named, named_group
        return store.ensure_vlm(scheme, group or DEFAULT_GROUP, vision)


@dataclass(frozen=True)
class Speech(Source):
    """The embedded speech model ('speech'): a talker around the embedded LM that emits Mimi
    codec frames, with synthetic codec weights (docs/guide/speech.md)."""
    kind = "speech"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        from vllm_edge.models.speech import talker

        return _fallback(scheme, name, list(talker.FORMATS), talker.KEY) or Fit(scheme)

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        return store.ensure_talker(scheme, group or DEFAULT_GROUP)


@dataclass(frozen=True)
class Gguf(Source):
    """A GGUF file: repacked into the default format (codes kept where they map), or imported
    in bf16; cached by the file's sha256."""
    kind = "gguf"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        fit = _fallback(scheme, name, [formats.DEFAULT], "a GGUF file") or Fit(scheme)
        if fit.scheme:
            kept = "; ".join(f"{', '.join(k.split(':', 1)[1] for k in f.lossless if k.startswith('gguf:'))} "
                             f"as {f.name}" for f in formats.all_formats()
                             if any(k.startswith("gguf:") for k in f.lossless))
            fit.reasons.append(f"a GGUF file: each tensor keeps its codes ({kept}; float tensors "
                               "quantized to 8 bits), mixed per layer as the file mixes them "
                               "(docs/guide/quantize.md); built once, cached by the file's sha256")
        return fit

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        if scheme and group not in (None, DEFAULT_GROUP):
            raise ModelNotAvailable(f"{self.arg}: a GGUF file is repacked at group {DEFAULT_GROUP} (its "
                                    f"blocks' width), not {group}")
        return store.ensure_gguf(self.arg, scheme)


@dataclass(frozen=True)
class Folder(Source):
    """A Hugging Face folder: ``path`` resolved, ``config`` its config.json."""
    path: Path = Path()
    config: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Bf16Folder(Folder):
    """An unquantized folder: quantized in the chosen format on first use, cached by content."""
    kind = "bf16 folder"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        if not scheme:
            return Fit(None, ["a model folder in bf16 runs as stored"])
        return Fit(scheme, [f"a model folder: quantized to {scheme} on first use, cached under "
                            "VLLM_EDGE_HOME/models/hf by its content (`vllm-edge models list`)"])

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        return store.ensure_folder(str(self.path), scheme, group) if scheme else self.path


@dataclass(frozen=True)
class QuantizedFolder(Folder):
    """A GPTQ or AWQ folder: repacked into a format that keeps its codes, at its own group;
    as stored when no format is chosen or the chosen one is its own."""
    method: str = ""
    kind = "quantized folder"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        if scheme is None or scheme == self.method or not formats.get(scheme).takes(self.method):
            return Fit(None, stored=True)
        return Fit(scheme, [f"a GPTQ or AWQ folder: its 4-bit codes are repacked into {scheme} at its "
                            "own group size (docs/guide/quantize.md), not quantized again; built once, "
                            "cached under VLLM_EDGE_HOME/models/hf by its content"])

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        if scheme is None or not self.fit(scheme).scheme:
            return self.path
        return store.ensure_folder(str(self.path), scheme)


@dataclass(frozen=True)
class Stored(Folder):
    """A build vllm-edge made, or a folder quantized in a format no repack takes: it runs as
    stored, whatever was chosen."""
    kind = "as stored"

    def fit(self, scheme: str | None, name: str | None = None) -> Fit:
        return Fit(None, stored=True)

    def build(self, scheme: str | None = None, group: int | None = None) -> Path:
        return self.path


def read_config(path: Path) -> dict:
    """A folder's config.json, or a clear error naming it."""
    from vllm_edge.common import model_config

    cfg_path = path / "config.json"
    try:
        return model_config.read(cfg_path)
    except model_config.ModelConfigError as exc:
        raise ModelNotAvailable(str(exc)) from None


def resolve(arg: str) -> Source:
    """The source a model argument names. Reads a folder's config once; builds nothing."""
    from vllm_edge.models import vlm

    arg = str(arg)
    parsed = vlm.parse_key(arg)
    if parsed:
        return Vlm(arg, parsed)
    if arg in SPEECH_KEYS:
        return Speech(arg)
    if arg == "default" or arg in store.MODELS:
        return Embedded(arg)
    if store.is_gguf(arg):
        return Gguf(arg)
    path = store.resolve_model_path(arg)  # names a path that does not exist
    if not path.is_dir():
        raise ModelNotAvailable(f"{arg}: not a model directory, a GGUF file (*.gguf) or an embedded "
                                "model name")
    config = read_config(path)
    if store.is_edge_build(path):
        return Stored(arg, path, config)
    method = store.quant_method(path)
    if method is None:
        return Bf16Folder(arg, path, config)
    if formats.taking(method) is not None:
        return QuantizedFolder(arg, path, config, method)
    return Stored(arg, path, config)


def is_speech(source: Source) -> bool:
    """A talker: its answers are codec frames, not text (the embedded one, or a folder whose
    config names the talker's architecture)."""
    if isinstance(source, Speech):
        return True
    from vllm_edge.models.speech.talker import ARCHITECTURE

    config = getattr(source, "config", None) or {}
    return ARCHITECTURE in (config.get("architectures") or [])


def own_scheme(name: str) -> str | None:
    """The format a measurement of ``name`` runs when none is asked for: a GGUF file runs its
    own types (the repack keeps every tensor's codes), anything else runs as stored (bf16)."""
    return formats.DEFAULT if store.is_gguf(str(name)) else None


def ensure_model(name: str, scheme: str | None = None, group: int | None = None) -> Path:
    """The directory an engine loads for ``name`` in ``scheme`` (``None``: bf16, or as stored),
    built on first use. A format the source cannot be built in is refused by the source."""
    return resolve(name).build(scheme, group)
