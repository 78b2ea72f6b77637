"""Every environment variable vllm-edge reads, declared once.

Each entry carries its type, default, meaning and the evidence for the default.
`tests/test_envs.py` fails on any environment access in `src/` whose name is
not declared here, and on any declared name missing from docs/configuration.md.

Read values through :func:`get`; never through ``os.environ`` elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: str  # "bool" | "int" | "str" | "path" | "json"
    default: Any
    meaning: str
    evidence: str
    # "vllm-edge" for our own switches; otherwise the project that owns the name.
    owner: str = "vllm-edge"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

DECLARED: dict[str, EnvVar] = {}


def _declare(*args: Any, **kwargs: Any) -> None:
    var = EnvVar(*args, **kwargs)
    if var.name in DECLARED:
        raise RuntimeError(f"environment variable {var.name} declared twice")
    DECLARED[var.name] = var


# --- our own switches -------------------------------------------------------
_declare(
    "VLLM_EDGE_HOME", "path", "~/.cache/vllm-edge",
    "Cache directory for prepared and quantized models.",
    "Follows the XDG cache convention that vLLM and Hugging Face use.",
)
_declare(
    "VLLM_EDGE_PATCH_AOT_CACHE", "bool", True,
    "Apply the CPU AOT compile-cache load fix (patches/aot_cache.py).",
    "benchmarks/results/aot_cache.json: the second start loads the cached "
    "artifact and compiles nothing instead of recompiling every start.",
)
_declare(
    "VLLM_EDGE_PATCH_KV_BUDGET", "bool", True,
    "Let an explicit kv_cache_memory_bytes win over VLLM_CPU_KVCACHE_SPACE (patches/kv_budget.py).",
    "tests/test_levers_engine.py: with VLLM_CPU_KVCACHE_SPACE=1 set, the KV tokens vLLM "
    "allocates follow the explicit budget only when the patch is on.",
)
_declare(
    "VLLM_EDGE_PATCH_ARENA_RELEASE", "bool", True,
    "Return freed heap to the OS after the worker's load_model and warm-up (patches/arena_release.py).",
    "tests/test_levers_engine.py and benchmarks/results/: RssAnon of the worker before and after.",
)
_declare(
    "VLLM_EDGE_PATCH_HERMES_JSON_END", "bool", True,
    "End a hermes tool call at the first </tool_call> outside a JSON string "
    "(patches/hermes_json_end.py).",
    "tests/test_patches_hermes.py: on vLLM 0.32.0 a schema-valid call whose string argument "
    "contains </tool_call> is lost without the patch; benchmarks/results/toolcalls/.",
)
_declare(
    "VLLM_EDGE_LOG_LEVEL", "str", "INFO",
    "Log level of the vllm_edge logger.",
    "INFO shows patch states once per process, which is what a user needs to "
    "see that the plugin is active.",
)
_declare(
    "VLLM_EDGE_PATCH_TARGET_OVERRIDE", "json", None,
    "JSON object {patch_name: 'module:qualname'} that re-points patches at other "
    "targets. For testing that a missing target is reported loudly; not for users.",
    "Used by tests/test_doctor.py to prove `doctor` exits non-zero on a missing target.",
)
_declare(
    "VLLM_EDGE_HW_PROFILE", "json", None,
    "JSON object that replaces the CPU probe for the weight-path choice (runtime/hw.py "
    "profile()): fields of CpuInfo, e.g. {\"arch\": \"x86_64\", \"isa\": [\"avx512\", "
    "\"amx_tile\", \"amx_int8\"]}. Thread counts still follow the real allowed cores.",
    "Unset: the probe reads this machine. tests/runtime/test_weight_path.py drives the "
    "AMX Xeon, Zen 4 and ARM64 choices through it.",
)
_declare(
    "VLLM_EDGE_RMSNORM_PROVIDER", "bool", False,
    "Put the edge_cpu provider (vLLM's own _C rms_norm / fused_add_rms_norm CPU kernels, "
    "registered through vllm.ir; kernels/rms_norm.py) first in the ir_op_priority of "
    "vllm-edge's engines (`run`, `bench speed`). Off leaves vLLM's CPU default, native. The "
    "provider stays selectable with --ir-op-priority either way.",
    "Off until an end-to-end A/B ranks it: benchmarks/specs/rmsnorm.json (bf16 and cpu_int4, "
    "pp512 and tg128); isolated timings in benchmarks/results/rmsnorm_micro.json. "
    "design.md 2.4: inductor already fuses the native norm with the residual add.",
)
_declare(
    "VLLM_EDGE_INT4_OPENMP", "bool", False,
    "cpu_int4 prefill on the dequantize route (no AVX512-BF16, VLLM_EDGE_INT4_GEMV=0, or an "
    "integer dequant_threshold): split the native dequantization over torch's own OpenMP team "
    "(quant/native.py, needs the -fopenmp build) instead of Python threads. Read once per process.",
    "Off until an end-to-end A/B on a quiet host ranks it. On a contended 2-core host a "
    "2-thread microbenchmark of the four SmolLM2 linears at 512 rows gave 387 vs 236 ms wall "
    "and 71 vs 46 ms CPU per layer, team vs Python threads (docs/cpu-4bit.md); at 1 thread the "
    "routes are the same code.",
)
_declare(
    "VLLM_EDGE_INT4_GEMV", "bool", True,
    "cpu_int4: run batches up to the dequantization threshold (with dequant_threshold "
    "\"auto\", every batch) on the native AVX512-BF16 product (quant/csrc/int4_gemv.c). "
    "0 uses tinygemm (_weight_int4pack_mm_for_cpu) and hands over to dequantize + GEMM at 48 "
    "rows, the route before the kernel existed. Read once per process.",
    "On: 2.2-2.6x tinygemm at one row on the 1B shapes (cpu_int4_microbench_product_g{32,64}.json); the 1B grid "
    "(benchmarks/results/grid/int4_1b/) runs both settings side by side.",
)

# --- names owned by other projects that we read -----------------------------
_declare(
    "VLLM_CACHE_ROOT", "path", "~/.cache/vllm",
    "vLLM's cache root; its torch_compile_cache holds the AOT artifacts.",
    "vLLM's own default.", owner="vllm",
)
_declare(
    "VLLM_ENABLE_V1_MULTIPROCESSING", "bool", True,
    "vLLM runs the engine core in a separate process when true.",
    "vLLM's own default.", owner="vllm",
)
_declare(
    "VLLM_PLUGINS", "str", None,
    "Comma list of vLLM plugins to load; unset loads all. Used by the import-cost "
    "benchmark to run vLLM without our plugin.",
    "vLLM's own default.", owner="vllm",
)

_declare(
    "VLLM_EDGE_THREADS", "int", None,
    "Compute threads of the edge one-process mode (`run`, `serve`, the benches). Unset: one per "
    "allowed core. Lower it on a host where other work keeps cores busy; `doctor` samples the "
    "load on the allowed cores and says when it would.",
    "Quiet 2-core host: 2 threads in one process decode at 42.6 tok/s against 31.1 for vLLM's "
    "multiprocess executor with 1 (grid/edge_mode_quiet). On a contended host the 2 OpenMP "
    "threads wait on each other and the ranking vanished (grid/edge_mode, NOT A RANKING).",
)

_declare(
    "VLLM_EDGE_MAX_IMAGE_BYTES", "int", 20 << 20,
    "Largest image input, in encoded bytes (file or data URL), that `run --image` and the "
    "image validation for `serve` accept (runtime/images.py); larger ones get a clear error "
    "(HTTP 413) before any decode.",
    "20 MiB covers a full-resolution phone JPEG; the processor resizes every image to the "
    "encoder's 512-pixel tile anyway, so larger inputs only cost memory and decode time.",
)
_declare(
    "VLLM_EDGE_MAX_IMAGE_PIXELS", "int", 4096 * 4096,
    "Largest image input in pixels (width x height, read from the header before decoding), "
    "for `run --image` and the image gate of `serve`.",
    "A 16-megapixel RGB image decodes to 48 MiB; this bounds the decode on a small device "
    "and stops decompression bombs well below PIL's own 89 M-pixel warning.",
)
_declare(
    "VLLM_EDGE_MAX_IMAGES", "int", 4,
    "Images allowed in one prompt (`run --image`, the image gate of `serve`); also vLLM's "
    "`limit_mm_per_prompt` for image models, whose own default is 999.",
    "With the default VLM build one image is 67 prompt tokens, so 4 leave most of a "
    "2048-token context for text; vLLM also sizes its encoder-cache profile from this limit.",
)

_declare(
    "OMP_NUM_THREADS", "int", None,
    "OpenMP thread count, set (never read for a decision) before torch or vLLM is imported: "
    "`bench speed` sets it to the size of its core set; the edge mode of `run` to the number "
    "of allowed cores in one-process mode, where vLLM's own thread binding does not run.",
    "vLLM's multiprocess CPU worker binds one thread per core but reserves one core for the "
    "frontend; on 2 cores that leaves 1 compute thread.", owner="openmp",
)


def _coerce(var: EnvVar, raw: str) -> Any:
    if var.type == "bool":
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{var.name}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
    if var.type == "int":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{var.name}={raw!r}: expected an integer") from None
    if var.type == "path":
        return Path(raw).expanduser()
    if var.type == "json":
        import json

        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{var.name}: invalid JSON ({exc})") from None
    return raw


def get(name: str) -> Any:
    """The typed value of a declared variable, or its default."""
    var = DECLARED[name]  # KeyError: undeclared names are a bug
    raw = os.environ.get(name)
    if raw is None:
        if var.type == "path" and var.default is not None:
            return Path(var.default).expanduser()
        return var.default
    return _coerce(var, raw)


def is_set(name: str) -> bool:
    DECLARED[name]
    return name in os.environ


def in_effect() -> dict[str, str]:
    """Declared variables that are set in this process, with their raw values."""
    return {name: os.environ[name] for name in sorted(DECLARED) if name in os.environ}


def home() -> Path:
    return get("VLLM_EDGE_HOME")
