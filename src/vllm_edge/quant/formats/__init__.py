"""The weight-format registry: every CPU weight format vllm-edge writes, one module each.

A format module under this package declares one :class:`WeightFormat` named ``FORMAT``;
the registry finds the modules by listing the package, so adding a format is one new module
(plus its kernel). Everything that offers, chooses, builds or documents a format asks here:
the ``--quant`` choices, the weight-path probe, the model store's build routes, the
quantizer, the plugin's vLLM registrations and the docs' format table.

Torch-free: a declaration names its heavy parts as ``"module:attribute"`` strings, loaded on
first use, so ``vllm-edge --help`` stays light.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_edge.common.errors import EdgeError


class UnknownFormat(EdgeError, ValueError):
    """A weight-format name no module of the registry declares."""


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class WeightFormat:
    """What one weight format is, and where its pieces live.

    ``encode`` is ``"module:function"``, called as ``f(weight, group) -> (tensors, dequantized)``:
    the suffixes and tensors that replace ``<module>.weight``, and what they decode to (for the
    quantizer's SNR report). ``quantization_config`` is called as ``f(group, **options) -> dict``,
    the ``quantization_config`` written into ``config.json``. ``vllm_config`` names the
    ``QuantizationConfig`` class the plugin registers with vLLM (``None``: vLLM has it built in).
    ``check_shapes``, when set, is called as ``f(shapes, group)`` before any work and raises on a
    weight the format cannot store. ``lossless`` lists the source types whose codes the format
    takes as they are (``"gguf:Q4_K"``, ``"gptq"``, ``"awq"``), each with its route, for the
    model store and the docs.
    """

    name: str
    summary: str
    bits: int
    groups: tuple[int, ...]
    default_group: int
    encode: str
    quantization_config: str
    vllm_config: str | None = None
    check_shapes: str | None = None
    # the input embedding can be stored in this format (vLLM's GPTQ reads no quantized embedding)
    quantizes_embedding: bool = True
    # the quantizer may apply it to a vision-language model's language side and tower
    vision: bool = False
    lossless: dict[str, str] = field(default_factory=dict)
    # files the quantizer writes beside config.json: name -> "module:function" (qcfg -> dict)
    sidecars: dict[str, str] = field(default_factory=dict)
    docs: str = ""

    def encoder(self) -> Callable[..., Any]:
        return _load(self.encode)

    def config(self, group: int, **options: Any) -> dict[str, Any]:
        return _load(self.quantization_config)(group, **options)

    def check(self, shapes: dict[str, tuple[int, ...]], group: int) -> None:
        if self.check_shapes:
            _load(self.check_shapes)(shapes, group)

    def sidecar_files(self, qcfg: dict[str, Any]) -> dict[str, Any]:
        """The files written beside ``config.json``: name -> JSON content."""
        return {name: _load(ref)(qcfg) for name, ref in self.sidecars.items()}

    def config_class(self) -> Any:
        return _load(self.vllm_config) if self.vllm_config else None

    def build_suffix(self, group: int) -> str:
        """The name a build of this format at ``group`` carries in the model cache."""
        return f"{self.name}-g{group}"

    def takes(self, source_type: str) -> bool:
        """Does this format keep ``source_type``'s codes (``"gptq"``, ``"gguf:Q4_0"``)?"""
        return source_type.lower() in {k.lower() for k in self.lossless}


# the quantizer's default format and the target of every lossless repack
DEFAULT = "cpu_int4"

_FORMATS: dict[str, WeightFormat] | None = None


def _discover() -> dict[str, WeightFormat]:
    global _FORMATS
    if _FORMATS is None:
        found: dict[str, WeightFormat] = {}
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
            if info.name.startswith("_"):
                continue
            fmt = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FORMAT", None)
            if isinstance(fmt, WeightFormat):
                found[fmt.name] = fmt
        _FORMATS = found
    return _FORMATS


def names() -> tuple[str, ...]:
    """Every registered format, in module order."""
    return tuple(_discover())


def get(name: str) -> WeightFormat:
    try:
        return _discover()[name]
    except KeyError:
        raise UnknownFormat(f"weight format {name!r} is not implemented; available: "
                            f"{', '.join(names())}") from None


def all_formats() -> list[WeightFormat]:
    return list(_discover().values())


def taking(source_type: str) -> WeightFormat | None:
    """The format that keeps ``source_type``'s codes as they are, if any."""
    return next((f for f in all_formats() if f.takes(source_type)), None)


def with_vllm_config() -> list[WeightFormat]:
    """The formats whose quantization config the plugin registers with vLLM."""
    return [f for f in all_formats() if f.vllm_config]


def table() -> list[dict[str, str]]:
    """The docs' format table: one row per format."""
    return [{"format": f.name, "bits": str(f.bits), "groups": ", ".join(map(str, f.groups)),
             "default group": str(f.default_group), "what": f.summary,
             "kept losslessly": ", ".join(f.lossless) or "–", "guide": f.docs}
            for f in all_formats()]
