"""``cpu_int4``: the W4A16 quantization config vLLM reads from a checkpoint.

The path choices live in the checkpoint's ``quantization_config`` (not in env vars)
because vLLM keys its compile cache on the model config: two arms that differ only in
an env var would share one compiled artifact.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)

from vllm_edge.quant import ops
from vllm_edge.quant.formats.cpu_int4 import NAME
GROUP_SIZES = (32, 64, 128, 256)
logger = logging.getLogger("vllm_edge.quant")


class CpuInt4Config(QuantizationConfig):
    """Fields (all in ``config.json`` -> ``quantization_config``):

    - ``group_size``: input columns per (scale, zero) pair;
    - ``quantize_embedding``: the input embedding is stored and looked up in 4 bits;
    - ``prefill_dequant``: batches above ``dequant_threshold`` rows dequantize to bf16 and
      run a bf16 GEMM (otherwise every batch runs the packed-weight product);
    - ``dequant_threshold``: that row count, or ``"auto"`` (what the quantizer writes):
      never dequantize where the native product runs (it matches dequantize + GEMM at 512
      rows and needs no workspace), 48 rows where only tinygemm does (``ops.auto_threshold``);
    - ``direct_dequant``: dequantize straight from the packed tinygemm tensor (one
      resident copy). When false, or when the installed kernel's layout no longer
      matches the measured one, a plain copy is kept for dequantization.
    - ``dequant_workspace_mb``: cap of the one reusable bf16 buffer the multi-row route
      dequantizes into (process-wide, grown to the largest layer up to the cap; larger
      layers run in chunks of output rows). Not a weight copy: one layer at a time.
    - ``modules_to_not_convert``: prefixes left in bf16;
    - ``quantize_vision`` (vision-language models only; absent otherwise): whether the
      quantizer packed the vision tower's linears. The checkpoint's tensors follow the
      choice, so it is made at quantization time; the quantizer also lists the tower in
      ``modules_to_not_convert`` when false, which is what the loader acts on. Kept here
      so the choice is visible and part of the config vLLM hashes.
    - ``layer_formats``: modules stored in another registered format, as
      ``{module: {"format": name, "group_size": g}}`` (a GGUF file's 5-, 6- and 8-bit
      tensors kept as ``cpu_int8``); the parts of a fused layer must agree.
    """

    def __init__(self, group_size: int = 128, quantize_embedding: bool = True,
                 prefill_dequant: bool = True,
                 dequant_threshold: int | str = ops.AUTO_NAME,
                 direct_dequant: bool = True,
                 modules_to_not_convert: list[str] | None = None,
                 dequant_workspace_mb: int = ops.DEFAULT_WORKSPACE_MB,
                 quantize_vision: bool | None = None,
                 layer_formats: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__()
        if group_size not in GROUP_SIZES:
            raise ValueError(
                f"cpu_int4: quantization_config.group_size={group_size!r} is not supported; "
                f"expected one of {GROUP_SIZES}"
            )
        auto = dequant_threshold == ops.AUTO_NAME
        if not auto and (isinstance(dequant_threshold, bool) or not isinstance(dequant_threshold, int)
                         or dequant_threshold < 0):
            raise ValueError(f"cpu_int4: quantization_config.dequant_threshold must be an integer >= 0 "
                             f"or \"{ops.AUTO_NAME}\", got {dequant_threshold!r}")
        if int(dequant_workspace_mb) < 1:
            raise ValueError(f"cpu_int4: dequant_workspace_mb must be >= 1, got {dequant_workspace_mb}")
        self.group_size = int(group_size)
        self.dequant_workspace_mb = int(dequant_workspace_mb)
        self.quantize_embedding = bool(quantize_embedding)
        self.prefill_dequant = bool(prefill_dequant)
        self.dequant_threshold: int | str = ops.AUTO_NAME if auto else int(dequant_threshold)
        self.direct_dequant = bool(direct_dequant)
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        self.quantize_vision = None if quantize_vision is None else bool(quantize_vision)
        self.layer_formats = _layer_formats(layer_formats)

    def __repr__(self) -> str:
        return (f"CpuInt4Config(group_size={self.group_size}, quantize_embedding="
                f"{self.quantize_embedding}, prefill_dequant={self.prefill_dequant}, "
                f"dequant_threshold={self.dequant_threshold}, direct_dequant={self.direct_dequant}, "
                f"dequant_workspace_mb={self.dequant_workspace_mb}, "
                f"modules_to_not_convert={self.modules_to_not_convert}, "
                f"quantize_vision={self.quantize_vision}, "
                f"layer_formats={len(self.layer_formats)} modules)")

    def to_dict(self) -> dict[str, Any]:
        out = {
            "quant_method": NAME,
            "group_size": self.group_size,
            "quantize_embedding": self.quantize_embedding,
            "prefill_dequant": self.prefill_dequant,
            "dequant_threshold": self.dequant_threshold,
            "direct_dequant": self.direct_dequant,
            "dequant_workspace_mb": self.dequant_workspace_mb,
            "modules_to_not_convert": self.modules_to_not_convert,
        }
        if self.quantize_vision is not None:
            out["quantize_vision"] = self.quantize_vision
        if self.layer_formats:
            out["layer_formats"] = self.layer_formats
        return out

    @property
    def effective_threshold(self) -> int:
        """The op's argument: ``ops.AUTO`` is resolved inside the op, so a compiled graph
        does not depend on the CPU it was compiled on."""
        if not self.prefill_dequant:
            return ops.NEVER
        return ops.AUTO if self.dequant_threshold == ops.AUTO_NAME else self.dequant_threshold

    @classmethod
    def get_name(cls) -> str:
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPU only; no GPU capability applies

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # read from config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CpuInt4Config":
        known = {"quant_method", "group_size", "quantize_embedding", "prefill_dequant",
                 "dequant_threshold", "direct_dequant", "modules_to_not_convert", "bits",
                 "dequant_workspace_mb",
                 "scheme", "version", "quantize_vision", "layer_formats"}
        unknown = sorted(set(config) - known)
        if unknown:
            logger.warning("cpu_int4: ignoring unknown quantization_config keys %s", unknown)
        bits = config.get("bits", 4)
        if bits != 4:
            raise ValueError(f"cpu_int4: quantization_config.bits={bits!r}; only 4 is supported")
        # group_size, dequant_threshold and dequant_workspace_mb are checked by __init__
        if "group_size" not in config:
            raise ValueError("cpu_int4: quantization_config.group_size is missing")
        skip = config.get("modules_to_not_convert")
        if skip is not None and not (isinstance(skip, list) and all(isinstance(m, str) for m in skip)):
            raise ValueError(f"cpu_int4: quantization_config.modules_to_not_convert={skip!r}; "
                             "expected a list of module names")
        return cls(
            group_size=config["group_size"],
            quantize_embedding=_flag(config, "quantize_embedding", True),
            prefill_dequant=_flag(config, "prefill_dequant", True),
            dequant_threshold=config.get("dequant_threshold", ops.AUTO_NAME),
            direct_dequant=_flag(config, "direct_dequant", True),
            modules_to_not_convert=skip,
            dequant_workspace_mb=config.get("dequant_workspace_mb", ops.DEFAULT_WORKSPACE_MB),
            quantize_vision=_flag(config, "quantize_vision", None),
            layer_formats=config.get("layer_formats"),
        )

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        if str(hf_quant_cfg.get("quant_method", "")).lower() == NAME and user_quant in (None, NAME):
            return NAME
        return None

    def _skipped_one(self, prefix: str) -> bool:
        return any(prefix == m or prefix.startswith(m + ".") for m in self.modules_to_not_convert)

    def _skipped(self, prefix: str) -> bool:
        """A fused layer (``qkv_proj``) is skipped when its checkpoint parts are; parts
        that disagree cannot be loaded into one layer, so that is an error."""
        base, _, last = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(last)
        if not parts:
            return self._skipped_one(prefix)
        states = {p: self._skipped_one(f"{base}.{p}" if base else p) for p in parts}
        if len(set(states.values())) > 1:
            raise ValueError(
                f"cpu_int4: modules_to_not_convert lists only some parts of the fused layer "
                f"{prefix}: {sorted(p for p, s in states.items() if s)} are bf16, "
                f"{sorted(p for p, s in states.items() if not s)} are not")
        return self._skipped_one(prefix) or all(states.values())

    def _layer_format(self, prefix: str) -> dict[str, Any] | None:
        """The ``layer_formats`` entry of a (possibly fused) layer, or None for cpu_int4."""
        if not self.layer_formats:
            return None
        base, _, last = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(last)
        if not parts:
            return self.layer_formats.get(prefix)
        entries = {p: self.layer_formats.get(f"{base}.{p}" if base else p) for p in parts}
        if len({repr(e) for e in entries.values()}) > 1:
            raise ValueError(f"cpu_int4: layer_formats gives the parts of the fused layer {prefix} "
                             f"different formats: {entries}")
        return next(iter(entries.values()))

    def _other_format(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        if not prefix and not isinstance(layer, ParallelLMHead) and hasattr(layer, "org_vocab_size"):
            # vLLM's Llama builds its input embedding without a prefix
            prefix = next((m for m in self.layer_formats if m.rsplit(".", 1)[-1] == "embed_tokens"), "")
        entry = self._layer_format(prefix)
        if entry is None:
            return None
        from vllm_edge.quant import formats

        cls = formats.get(entry["format"]).config_class()
        return cls.for_group(entry["group_size"], self.packed_modules_mapping).get_quant_method(layer, prefix)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )

        from vllm_edge.quant.embedding import CpuInt4EmbeddingMethod
        from vllm_edge.quant.linear import CpuInt4LinearMethod

        if isinstance(layer, (LinearBase, VocabParallelEmbedding)) and not self._skipped(prefix):
            other = self._other_format(layer, prefix)
            if other is not None:
                return other
        if isinstance(layer, ParallelLMHead):
            if self._skipped(prefix):
                return UnquantizedEmbeddingMethod()
            return CpuInt4EmbeddingMethod(self, prefix)
        if isinstance(layer, VocabParallelEmbedding):
            if not self.quantize_embedding or self._skipped(prefix):
                return UnquantizedEmbeddingMethod()
            return CpuInt4EmbeddingMethod(self, prefix)
        if isinstance(layer, LinearBase):
            if self._skipped(prefix):
                return UnquantizedLinearMethod()
            return CpuInt4LinearMethod(self, prefix)
        return None


def _layer_formats(value: Any) -> dict[str, dict[str, Any]]:
    """``layer_formats`` checked: every entry names a registered format with a vLLM config
    other than cpu_int4, and an integer group it takes."""
    if value is None:
        return {}
    from vllm_edge.quant import formats

    if not isinstance(value, dict):
        raise ValueError(f"cpu_int4: quantization_config.layer_formats={value!r}; expected an "
                         "object of module -> {format, group_size}")
    out = {}
    for module, entry in value.items():
        name = entry.get("format") if isinstance(entry, dict) else None
        group = entry.get("group_size") if isinstance(entry, dict) else None
        where = f"cpu_int4: quantization_config.layer_formats[{module!r}]"
        if name == NAME or name not in {f.name for f in formats.with_vllm_config()}:
            raise ValueError(f"{where}.format={name!r}; expected one of "
                             f"{[f.name for f in formats.with_vllm_config() if f.name != NAME]}")
        if isinstance(group, bool) or not isinstance(group, int) or group not in formats.get(name).groups:
            raise ValueError(f"{where}.group_size={group!r}; {name} takes {formats.get(name).groups}")
        out[str(module)] = {"format": name, "group_size": group}
    return out


def _flag(config: dict[str, Any], key: str, default: bool | None) -> bool | None:
    """A JSON boolean, never a truthy string ("false" would read as True)."""
    value = config.get(key, default)
    if value is not default and not isinstance(value, bool):
        raise ValueError(f"cpu_int4: quantization_config.{key}={value!r}; expected true or false")
    return value
