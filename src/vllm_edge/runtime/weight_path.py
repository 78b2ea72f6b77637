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

from vllm_edge.quant import formats
from vllm_edge.quant.formats import cpu_int4, gptq

CPU_INT4 = cpu_int4.NAME
PATHS = ("gptq_w4a8", CPU_INT4, "bf16")
PRIORITIES = ("speed", "fidelity")
# the weight format each path runs (scheme, group), at the format's default group; cpu_int4 g32:
# docs/design/cpu-int4.md, "Group size and the tied head"
CHECKPOINT = {"gptq_w4a8": (gptq.NAME, gptq.FORMAT.default_group),
              CPU_INT4: (CPU_INT4, cpu_int4.FORMAT.default_group), "bf16": (None, None)}
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
        path = WeightPath(CPU_INT4, reasons, verified=False)
    elif arch.lower() not in _X86:
        reasons.append(f"arch {arch or 'unknown'}: no measured 4-bit path; cpu_int4 is the portable one")
        path = WeightPath(CPU_INT4, reasons, verified=False)
    elif priority == "fidelity":
        reasons.append("priority fidelity: W4A16 keeps activations in bf16, W4A8 also rounds "
                       "them to int8; bf16 weights are opt-in with --quant none")
        path = WeightPath(CPU_INT4, reasons)
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
            path = WeightPath(CPU_INT4, reasons)
        elif isa.get("avx2"):
            reasons.append("AVX2 without AVX-512: torch packs int4 weights in 32-row blocks, and cpu_int4 "
                           "runs its AVX2 product on them up to 48 rows (quant/csrc/int4_gemv32.c; end to "
                           "end against tinygemm in benchmarks/results/grid/int4_avx2_product/summary.json)")
            path = WeightPath(CPU_INT4, reasons)
        else:
            reasons.append("no AVX-512 or AVX2: cpu_int4 runs torch's tinygemm, not measured on such a CPU")
            path = WeightPath(CPU_INT4, reasons, verified=False)
    if numa > 1:
        path.reasons.append(f"{numa} NUMA nodes: one copy of the weights serves all cores "
                            "(cross-node reads not measured)")
    return path


def gptq_export_status() -> tuple[bool, str]:
    """Can ``run`` build and serve the GPTQ checkpoint the W4A8 path needs?"""
    if gptq.NAME not in formats.names():
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
            return WeightPath(CPU_INT4, chosen.reasons + [f"falling back to cpu_int4: {why}"],
                              verified=True, fallback_from="gptq_w4a8")
    return chosen


def for_checkpoint(path: Any) -> WeightPath:
    """A quantized model directory, or one vllm-edge built, runs as stored: report what it
    is, choose nothing."""
    from pathlib import Path

    from vllm_edge.models.resolver import read_config

    cfg = read_config(Path(path))
    method = (cfg.get("quantization_config") or {}).get("quant_method")
    name = "bf16" if method is None else str(method)
    group = (cfg.get("quantization_config") or {}).get("group_size")
    return WeightPath(name, [f"a model directory runs as stored (quantization_config: "
                             f"{method or 'none'}); --quant and the probe do not requantize it"],
                      scheme=method, group=group)


def model_for_engine(model: str, priority: str = "speed", dtype: str = "auto") -> tuple[Any, WeightPath]:
    """(directory to load, its weight path) for a model argument of `run` or `serve`: the
    resolver reads the argument into a source, the probe picks the format for this CPU, the
    source says what it becomes in it and builds it (on first use, cached). The build's last
    use is recorded for `vllm-edge models list`."""
    from vllm_edge.common import hw
    from vllm_edge.models import cache, resolver

    source = resolver.resolve(model)
    chosen = for_run(hw.profile(), priority, dtype)
    fit = source.fit(chosen.scheme, chosen.name)
    if fit.stored:
        path = source.build()
        wpath = for_checkpoint(path)
    else:
        if fit.fallback:
            fmt = formats.get(fit.scheme)
            wpath = WeightPath(fmt.name, chosen.reasons + fit.reasons, fallback_from=chosen.name,
                               scheme=fmt.name, group=fmt.default_group)
        else:
            wpath = chosen
            wpath.reasons.extend(fit.reasons)
        path = source.build(wpath.scheme, wpath.group)
        if isinstance(source, resolver.QuantizedFolder):  # repacked at the checkpoint's own group
            wpath.group = for_checkpoint(path).group
    cache.mark_used(path)
    return path, wpath
