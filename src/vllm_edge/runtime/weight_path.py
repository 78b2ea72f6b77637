"""Which weights run on this CPU: vLLM's W4A8 GPTQ path, our ``cpu_int4`` (W4A16), or bf16.

:func:`select_weight_path` is pure: a hardware profile in, a path and its reasons out
(docs/design/cpu-int4.md gives the facts). :func:`for_run` applies what ``vllm-edge run`` can
actually build today on top of it, and says so whenever it departs from the choice.

Why ``fidelity`` picks ``cpu_int4`` and not bf16: W4A16 and W4A8 share 4-bit weights;
W4A8 also rounds every activation row to int8, W4A16 keeps them in bf16, so W4A16 is the
higher-fidelity 4-bit path. bf16 costs ~3.5x the weight bytes and is what the quality
checks compare against; it is one flag away (``--quant none``), never an automatic choice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PATHS = ("gptq_w4a8", "cpu_int4", "bf16")
PRIORITIES = ("speed", "fidelity")
# the quantized checkpoint each path runs (scheme, group); cpu_int4 g32: docs/design/cpu-int4.md,
# "Group size and the tied head"
CHECKPOINT = {"gptq_w4a8": ("gptq", 64), "cpu_int4": ("cpu_int4", 32), "bf16": (None, None)}
_ARM = ("aarch64", "arm64")
_X86 = ("x86_64", "amd64", "i686", "i386")


@dataclass
class WeightPath:
    name: str
    reasons: list[str] = field(default_factory=list)
    # False when nobody has measured this path on this kind of CPU
    verified: bool = True
    fallback_from: str | None = None

    # the checkpoint it runs; filled from CHECKPOINT for the three known paths
    scheme: str | None = None
    group: int | None = None

    def __post_init__(self) -> None:
        if self.scheme is None and self.group is None:
            self.scheme, self.group = CHECKPOINT.get(self.name, (None, None))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def explain(self) -> list[str]:
        """The lines `run` and `serve` print: the path, then each reason."""
        tag = "" if self.verified else " (unverified)"
        return [f"weight path: {self.name}{tag}"] + [f"  - {why}" for why in self.reasons]


def _fields(profile: Any) -> tuple[str, dict[str, bool], int]:
    d = profile if isinstance(profile, dict) else profile.to_dict()
    return str(d.get("arch", "")), dict(d.get("isa") or {}), int(d.get("numa_nodes") or 0)


def select_weight_path(profile: Any, priority: str = "speed") -> WeightPath:
    """``profile``: a :class:`~vllm_edge.common.hw.CpuInfo` or its dict."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: expected one of {PRIORITIES}")
    arch, isa, numa = _fields(profile)
    amx = isa.get("amx_tile", False) and isa.get("amx_int8", False)
    reasons: list[str] = []
    if arch in _ARM:
        reasons.append("ARM64: vLLM's W4A8 kernel (int4_scaled_mm_cpu) needs x86 AMX")
        reasons.append("cpu_int4 runs torch's tinygemm, which has an ARM build, but neither its "
                       "speed nor its packed layout has been measured on ARM (the loader re-checks "
                       "the layout and keeps a plain copy if it differs)")
        path = WeightPath("cpu_int4", reasons, verified=False)
    elif arch.lower() not in _X86:
        reasons.append(f"arch {arch or 'unknown'}: no measured 4-bit path; cpu_int4 is the portable one")
        path = WeightPath("cpu_int4", reasons, verified=False)
    elif priority == "fidelity":
        reasons.append("priority fidelity: W4A16 keeps activations in bf16, W4A8 also rounds "
                       "them to int8; bf16 weights are opt-in with --quant none")
        path = WeightPath("cpu_int4", reasons)
    elif amx and not isa.get("avx512_bf16"):
        reasons.append("x86 with AMX (amx_tile, amx_int8) and priority speed: vLLM's W4A8 kernel "
                       "int4_scaled_mm_cpu runs a symmetric GPTQ checkpoint on the AMX tiles "
                       "(VLLM_CPU_INT4_W4A8 defaults to on)")
        reasons.append("not measured by this project: no AMX machine was available")
        path = WeightPath("gptq_w4a8", reasons, verified=False)
    else:
        if amx:
            reasons.append("x86 with AMX and AVX512-BF16: cpu_int4's native product, which this "
                           "project has measured, rather than vLLM's W4A8 kernel, which it has not")
        elif isa.get("amx_tile"):
            reasons.append("AMX tiles without amx_int8: the W4A8 kernel needs int8 tiles")
        else:
            reasons.append("x86 without AMX: vLLM's W4A8 kernel is AMX-only; without it vLLM runs GPTQ "
                           "as W4A16 too (cpu_gemm_wna16 'vec'), and cpu_int4 is our W4A16 path")
        if isa.get("avx512"):
            # The reason states the kernel, not a figure: figures live in the artifacts.
            if isa.get("avx512_bf16"):
                reasons.append("AVX-512 with BF16: cpu_int4 runs its native product straight from the "
                               "packed 4-bit weights (quant/csrc/int4_gemv.c; timings in "
                               "benchmarks/results/cpu_int4_microbench_product_g*.json)")
            else:
                reasons.append("AVX-512 without BF16: cpu_int4 runs torch's tinygemm, measured faster "
                               "than bf16 at one row (benchmarks/results/cpu_int4_microbench.json)")
            path = WeightPath("cpu_int4", reasons)
        else:
            reasons.append("no AVX-512: tinygemm's AVX2 path has not been measured")
            path = WeightPath("cpu_int4", reasons, verified=False)
    if numa > 1:
        path.reasons.append(f"{numa} NUMA nodes: one copy of the weights serves all cores "
                            "(cross-node reads not measured)")
    return path


def gptq_export_status() -> tuple[bool, str]:
    """Can ``run`` build and serve the GPTQ checkpoint the W4A8 path needs?"""
    from vllm_edge.quant.quantize import SCHEMES

    if "gptq" not in SCHEMES:
        return False, "the GPTQ exporter (`vllm-edge quantize --quant gptq`) is not implemented yet"
    return True, ""


def for_run(profile: Any, priority: str = "speed", dtype: str = "auto") -> WeightPath:
    """The path ``run`` takes: the selection, ``--quant none`` (``dtype='bf16'``), and any fallback, with reasons."""
    chosen = select_weight_path(profile, priority)
    if dtype == "bf16":
        return WeightPath("bf16", ["--quant none: unquantized weights, as requested "
                                   f"(the probe would choose {chosen.name})"])
    if dtype != "auto":
        raise ValueError(f"dtype {dtype!r}: expected 'auto' or 'bf16'")
    if chosen.name == "gptq_w4a8":
        ok, why = gptq_export_status()
        if not ok:
            return WeightPath("cpu_int4", chosen.reasons + [f"falling back to cpu_int4: {why}"],
                              verified=True, fallback_from="gptq_w4a8")
    return chosen


def for_checkpoint(path: Any) -> WeightPath:
    """A quantized model directory, or one vllm-edge built, runs as stored: report what it
    is, choose nothing."""
    import json
    from pathlib import Path

    from vllm_edge.models.store import ModelNotAvailable

    cfg_path = Path(path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelNotAvailable(f"{cfg_path}: cannot read a model config ({exc}); a model "
                                "directory must be a Hugging Face folder") from None
    method = (cfg.get("quantization_config") or {}).get("quant_method")
    name = "bf16" if method is None else str(method)
    group = (cfg.get("quantization_config") or {}).get("group_size")
    return WeightPath(name, [f"a model directory runs as stored (quantization_config: "
                             f"{method or 'none'}); --quant and the probe do not requantize it"],
                      scheme=method, group=group)


def model_for_engine(model: str, priority: str = "speed", dtype: str = "auto") -> tuple[Any, WeightPath]:
    """(directory to load, its weight path) for a model argument of `run` or `serve`; the
    build's last use is recorded for `vllm-edge models list`."""
    from vllm_edge.models import cache

    path, wpath = _model_for_engine(model, priority, dtype)
    cache.mark_used(path)
    return path, wpath


def _model_for_engine(model: str, priority: str, dtype: str) -> tuple[Any, WeightPath]:
    """An embedded model, a GGUF file or a bf16 model folder gets the path chosen for this CPU,
    prepared (a GGUF repacked, a folder quantized) on first use and cached; a quantized
    folder, or a build vllm-edge made, runs as stored."""
    from vllm_edge.common import hw
    from vllm_edge.models import store, vlm

    if model == vlm.KEY:
        wpath = for_run(hw.profile(), priority, dtype)
        if wpath.scheme not in (None, "cpu_int4"):
            wpath = WeightPath("cpu_int4", wpath.reasons + [
                f"{vlm.KEY} has no {wpath.name} build; using cpu_int4"], fallback_from=wpath.name)
        return store.ensure_model(model, wpath.scheme, wpath.group), wpath
    if model == "default" or model in store.MODELS:
        wpath = for_run(hw.profile(), priority, dtype)
        return store.ensure_model(model, wpath.scheme, wpath.group), wpath
    if store.is_gguf(model):
        wpath = for_run(hw.profile(), priority, dtype)
        if wpath.scheme not in (None, "cpu_int4"):
            wpath = WeightPath("cpu_int4", wpath.reasons + [
                f"a GGUF file has no {wpath.name} build; using cpu_int4"], fallback_from=wpath.name)
        if wpath.scheme:
            wpath.reasons.append("a GGUF file: its Q4_0, Q4_1 and Q4_K tensors are repacked into "
                                 "cpu_int4 g32 with their 4-bit codes, other formats quantized again "
                                 "(docs/guide/quantize.md); built once, cached by the file's sha256")
        return store.ensure_gguf(model, wpath.scheme), wpath
    path = store.ensure_model(model)
    stored = for_checkpoint(path)
    if store.is_gptq_folder(path):
        wpath = for_run(hw.profile(), priority, dtype)
        if wpath.scheme in (None, "gptq"):  # as stored, or vLLM's own GPTQ path on this CPU
            return path, stored
        wpath.reasons.append("a GPTQ or AWQ folder: its 4-bit codes are repacked into cpu_int4 at its own "
                             "group size (docs/guide/quantize.md), not quantized again; built once, "
                             "cached under VLLM_EDGE_HOME/models/hf by its content")
        built = store.ensure_folder(str(path), "cpu_int4")
        wpath.group = for_checkpoint(built).group
        return built, wpath
    if stored.scheme is not None or store.is_edge_build(path):
        return path, stored
    wpath = for_run(hw.profile(), priority, dtype)
    if not wpath.scheme:
        wpath.reasons.append("a model folder in bf16 runs as stored")
        return path, wpath
    wpath.reasons.append(f"a model folder: quantized to {wpath.scheme} on first use, cached under "
                         "VLLM_EDGE_HOME/models/hf by its content (`vllm-edge models list`)")
    return store.ensure_folder(str(path), wpath.scheme, wpath.group), wpath
