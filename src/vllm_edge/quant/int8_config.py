"""``cpu_int8``: the W8A16 quantization config vLLM reads from a checkpoint.

A checkpoint whose every quantized layer is 8-bit names ``quant_method: cpu_int8``. A
checkpoint that mixes formats per layer, as a llama.cpp file does, names ``cpu_int4`` and
lists its 8-bit layers in ``layer_formats`` (:mod:`.config`); those layers get the methods
built here, through :meth:`CpuInt8Config.for_group`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)

from vllm_edge.quant.formats.cpu_int8 import NAME
from vllm_edge.quant.int8 import GROUPS

logger = logging.getLogger("vllm_edge.quant")


class CpuInt8Config(QuantizationConfig):
    """Fields (``config.json`` -> ``quantization_config``): ``group_size`` (input columns per
    scale and offset), ``quantize_embedding`` (the input embedding is stored and looked up in
    8 bits) and ``modules_to_not_convert`` (prefixes left in bf16)."""

    def __init__(self, group_size: int = 32, quantize_embedding: bool = True,
                 modules_to_not_convert: list[str] | None = None) -> None:
        super().__init__()
        if group_size not in GROUPS:
            raise ValueError(f"cpu_int8: quantization_config.group_size={group_size!r} is not "
                             f"supported; expected one of {GROUPS}")
        self.group_size = int(group_size)
        self.quantize_embedding = bool(quantize_embedding)
        self.modules_to_not_convert = list(modules_to_not_convert or [])

    @classmethod
    def for_group(cls, group_size: int, packed_modules_mapping: dict[str, list[str]]) -> "CpuInt8Config":
        """The config one layer of a mixed checkpoint runs under."""
        cfg = cls(group_size)
        cfg.packed_modules_mapping = dict(packed_modules_mapping)
        return cfg

    def __repr__(self) -> str:
        return (f"CpuInt8Config(group_size={self.group_size}, quantize_embedding="
                f"{self.quantize_embedding}, modules_to_not_convert={self.modules_to_not_convert})")

    def to_dict(self) -> dict[str, Any]:
        return {"quant_method": NAME, "bits": 8, "group_size": self.group_size,
                "quantize_embedding": self.quantize_embedding,
                "modules_to_not_convert": self.modules_to_not_convert}

    @classmethod
    def get_name(cls) -> str:
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPU only

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CpuInt8Config":
        unknown = sorted(set(config) - {"quant_method", "bits", "group_size", "quantize_embedding",
                                        "modules_to_not_convert"})
        if unknown:
            logger.warning("cpu_int8: ignoring unknown quantization_config keys %s", unknown)
        if config.get("bits", 8) != 8:
            raise ValueError(f"cpu_int8: quantization_config.bits={config.get('bits')!r}; only 8 is supported")
        if "group_size" not in config:
            raise ValueError("cpu_int8: quantization_config.group_size is missing")
        skip = config.get("modules_to_not_convert")
        if skip is not None and not (isinstance(skip, list) and all(isinstance(m, str) for m in skip)):
            raise ValueError(f"cpu_int8: quantization_config.modules_to_not_convert={skip!r}; "
                             "expected a list of module names")
        embed = config.get("quantize_embedding", True)
        if not isinstance(embed, bool):
            raise ValueError(f"cpu_int8: quantization_config.quantize_embedding={embed!r}; "
                             "expected true or false")
        return cls(config["group_size"], embed, skip)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        if str(hf_quant_cfg.get("quant_method", "")).lower() == NAME and user_quant in (None, NAME):
            return NAME
        return None

    def _skipped(self, prefix: str) -> bool:
        base, _, last = prefix.rpartition(".")
        parts = self.packed_modules_mapping.get(last) or [last]
        names = [f"{base}.{p}" if base else p for p in parts] + [prefix]
        return any(n == m or n.startswith(m + ".") for n in names for m in self.modules_to_not_convert)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )

        from vllm_edge.quant.int8_embedding import CpuInt8EmbeddingMethod
        from vllm_edge.quant.int8_linear import CpuInt8LinearMethod

        if isinstance(layer, ParallelLMHead):
            return UnquantizedEmbeddingMethod() if self._skipped(prefix) else CpuInt8EmbeddingMethod(self, prefix)
        if isinstance(layer, VocabParallelEmbedding):
            if not self.quantize_embedding or self._skipped(prefix):
                return UnquantizedEmbeddingMethod()
            return CpuInt8EmbeddingMethod(self, prefix)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod() if self._skipped(prefix) else CpuInt8LinearMethod(self, prefix)
        return None
