"""Every environment variable vllm-edge reads, declared once.

Each entry carries its type, default, meaning and the evidence for the default.
`tests/test_envs.py` fails on any environment access in `src/` whose name is
not declared here, and when docs/reference/configuration.md differs from what
:func:`markdown` renders from these declarations (regenerate it with
``python -m vllm_edge.envs > docs/reference/configuration.md``).

Evidence names the artifact or test, never a figure copied from it: figures live
in the artifacts and in the generated docs/results/.

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
    # the smallest value an "int" accepts
    minimum: int | None = None


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
    "Return freed heap to the OS after the worker's load_model, its warm-up forward (before the KV "
    "cache is allocated) and warm-up (patches/arena_release.py).",
    "tests/test_levers_engine.py and benchmarks/results/: RssAnon of the worker before and after.",
)
_declare(
    "VLLM_EDGE_PATCH_WEIGHT_HUGE_PAGES", "bool", True,
    "After the worker's load_model, collapse the memory the model's weights cover into huge "
    "pages with MADV_COLLAPSE (Linux 6.1 and later), so that decode does not stream them through "
    "small pages, a TLB miss and a prefetcher stop each (patches/weight_huge_pages.py, "
    "runtime/huge_pages.py).",
    "tests/runtime/test_huge_pages.py: a tensor's pages become AnonHugePages and RssAnon does not "
    "grow; benchmarks/results/grid/huge_pages/: decode with the switch on and off, interleaved.",
)
_declare(
    "VLLM_EDGE_PATCH_GEMMA2_EMBEDDING", "bool", True,
    "Build Gemma 2's token embedding (and so its tied head) with the checkpoint's quantization, "
    "as vLLM does for Gemma 3 (patches/gemma2_embedding_quant.py). Off: Gemma 2 GGUF repacks "
    "keep the embedding in bf16 (a separate build).",
    "tests/test_patches_gemma2_embedding.py: the module name is rebound for the construction only; "
    "tests/models/test_gguf_families_engine.py: a Gemma 2 repack runs its embedding and head in "
    "cpu_int8.",
)
_declare(
    "VLLM_EDGE_PATCH_WNA16_MISSING_OP", "bool", True,
    "Make vLLM's CPU W4A16 kernel decline, with a reason, where its op is not built "
    "(patches/wna16_missing_op.py).",
    "tests/test_patches.py: without the op the kernel declines naming it; with the op the "
    "original answers. tests/quant/test_gptq_engine.py: on an AVX2 CPU a GPTQ export is refused "
    "at load naming the op, where unpatched it died in the profiling run.",
)
_declare(
    "VLLM_EDGE_PATCH_AMX_ATTENTION", "bool", True,
    "Run vLLM's AVX-512 CPU attention kernel instead of its AMX one (patches/amx_attention.py).",
    "tests/test_patches.py: on an AMX CPU the choice is vec with the patch and amx without; with "
    "amx a cpu_int4 engine dies with SIGILL in the attention kernel (tests/bench/"
    "test_profile_engine.py and tests/bench/test_speed_engine.py on the AMX Xeon CI host).",
)
_declare(
    "VLLM_EDGE_PATCH_HERMES_JSON_END", "bool", True,
    "End a hermes tool call at the first </tool_call> outside a JSON string "
    "(patches/hermes_json_end.py).",
    "tests/test_patches_hermes.py: on vLLM 0.32.0 a schema-valid call whose string argument "
    "contains </tool_call> is lost without the patch; benchmarks/results/toolcalls/.",
)
_declare(
    "VLLM_EDGE_FUSED_KV_ATTENTION", "bool", True,
    "Override vLLM's CPU attention backend (CPU_ATTN, through its backend registry) with one "
    "whose forward writes the KV cache and attends in one custom op per layer, instead of "
    "unified_kv_cache_update plus unified_attention_with_output (attention/cpu_fused.py). "
    "Same C kernels; also keys vLLM's compile cache. 0 leaves vLLM's backend.",
    "On: half the attention op calls per step at no measured cost (benchmarks/results/grid/"
    "step_core, arm \"no fused attention\": the forward medians are within the noise, so the "
    "A/B did not rank it; upstream split the ops for a fusion CPU does not run). "
    "tests/attention/test_cpu_fused_engine.py: same greedy tokens as the stock backend and no "
    "unified_kv_cache_update call.",
)
_declare(
    "VLLM_EDGE_CPP_WRAPPER", "bool", True,
    "Compiled engines (not --enforce-eager) build Inductor's wrapper around the graph in C++ "
    "(cpp_wrapper, compiled apart from the kernels) with VLLM_USE_LAYERNAME=0, so the graph "
    "calls its kernels and custom ops from C++ instead of a Python function "
    "(runtime/cpp_wrapper.py). It keys vLLM's compile cache: graphs built with the Python "
    "wrapper are not reused. 0 keeps Inductor's Python wrapper.",
    "On: benchmarks/results/grid/cpp_wrapper (bench step, the C++ wrapper against the Python "
    "one, interleaved passes). tests/runtime/test_cpp_wrapper.py checks the engine arguments; "
    "tests/serving/test_graph_cache_engine.py checks on the real engine that the keep-alive "
    "server's background builder caches a graph with the C++ wrapper, and that the next start "
    "loads it and answers.",
)
_declare(
    "VLLM_EDGE_PATCH_GREEDY_SAMPLER", "bool", False,
    "Sample an all-greedy batch that nothing can bias (no logprobs, penalties, bad words, "
    "allowed-token masks, logit bias, min_tokens, thinking budget) with an argmax on the "
    "logits' own dtype, without vLLM's float32 copy and logits-processor chain "
    "(patches/greedy_sampler.py).",
    "Off: it lost the A/B in benchmarks/results/grid/step_levers (the sampler section is slower "
    "with it: torch's bf16 argmax over the vocabulary costs more than the float32 copy plus "
    "vLLM's C argmax). Same tokens either way (tests/test_patches_step.py, "
    "tests/test_levers_engine.py).",
)
_declare(
    "VLLM_EDGE_PATCH_PP_STAGE_BUFFER", "bool", True,
    "Let a pipeline stage after the first allocate its input buffer on first use "
    "(patches/pp_stage_buffer.py).",
    "Without it an eager pipeline-parallel engine with an explicit KV budget fails its first "
    "step (tests/runtime/test_parallel_engine.py runs PP=2 eager).",
)
_declare(
    "VLLM_EDGE_PATCH_KERNEL_REBIND_SCAN", "bool", True,
    "Let vLLM's Triton-kernel override scan skip module attributes whose vars() is not a "
    "mapping (patches/kernel_rebind_scan.py).",
    "Without it no engine starts in a process that imported numba, e.g. the next engine after "
    "one with n-gram speculation (tests/test_patches_rebind.py reproduces it; "
    "tests/runtime/test_speculative_engine.py starts three engines in one process).",
)
_declare(
    "VLLM_EDGE_PATCH_TOKENIZER_BUILD_LISTS", "bool", True,
    "Drop the Python vocabulary and merges lists a loaded tokenizer was built from, where no "
    "method of its class reads them (patches/tokenizer_build_lists.py).",
    "tests/test_patches_tokenizer.py: the lists go, encoding and decoding are unchanged, a class "
    "that reads them keeps them, and a renderer's RssAnon falls on the real Gemma 3 tokenizer; "
    "benchmarks/results/grid/tokenizer_memory: an engine start's RssAnon with and without.",
)
_declare(
    "VLLM_EDGE_PATCH_TOKENIZER_COPIES", "bool", True,
    "Copy vLLM's cached tokenizer without rebuilding its vocabulary cache, and start the "
    "renderer's tokenizer pool with one deep copy; more are made when renders overlap "
    "(patches/tokenizer_copies.py).",
    "tests/test_patches_tokenizer.py: copies share the cached vocabulary, a deep copy has its own "
    "Rust tokenizer and encodes the same, the pool deep-copies once at start; "
    "benchmarks/results/grid/tokenizer_memory.",
)
_declare(
    "VLLM_EDGE_PATCH_PROCESSOR_TEMPLATE_PROBE", "bool", True,
    "For a text-only model whose folder holds no processor files, skip the AutoProcessor load "
    "vLLM makes to look for a processor chat template (patches/processor_template_probe.py).",
    "tests/test_patches_tokenizer.py: no processor is loaded and the same template is resolved; "
    "a folder with a processor config still loads it; benchmarks/results/grid/tokenizer_memory.",
)
_declare(
    "VLLM_EDGE_PATCH_SLOT_MAPPING_BIND", "bool", True,
    "Bind the per-step slot-mapping launch's positional arguments by name without "
    "inspect.Signature.bind (patches/slot_mapping_bind.py).",
    "On: the same launch inputs (tests/test_patches_step.py) and no Signature.bind per "
    "decode step in a real engine (tests/test_levers_engine.py). Speed A/B in "
    "benchmarks/results/grid/step_levers (arm \"no bind cache\"): within the noise; kept, it "
    "only removes work.",
)
_declare(
    "VLLM_EDGE_ISA_PROBE_CACHE", "bool", True,
    "Remember Inductor's vector-ISA probe under VLLM_EDGE_HOME/isa_probe (keyed by CPU flags, "
    "torch and the compiler) and, when every advertised ISA passed, skip re-testing them at "
    "the next start (runtime/isa_probe.py).",
    "benchmarks/results/startup/: the `vector ISA probe` phase of a warm start, with and "
    "without the record.",
)
_declare(
    "VLLM_EDGE_GC_FREEZE", "bool", True,
    "At plugin load, move every object the process tracks into the garbage collector's "
    "permanent generation (gc.freeze, as vLLM's own freeze_gc_heap does once the engine is "
    "up), so the full collections vLLM runs on the way to ready skip the import-time heap "
    "(runtime/gc_freeze.py). 0: only vLLM's own freeze.",
    "benchmarks/results/startup/: a warm `run` start with and without it; tests/runtime/"
    "test_gc_freeze.py: the import-time heap is frozen in every engine process.",
)
_declare(
    "VLLM_EDGE_GC_START", "bool", True,
    "While `serve`, a keep-alive server or an in-process `run` starts, run the garbage "
    "collector far less often than Python's default thresholds, until the engine is ready "
    "(runtime/gc_freeze.py): the imports of torch and vLLM otherwise walk their own growing "
    "heap many times over. 0: Python's thresholds throughout.",
    "benchmarks/results/server_start/: a warm keep-alive server start with and without it, "
    "side by side; tests/runtime/test_gc_freeze.py: the thresholds are held and given back.",
)
_declare(
    "VLLM_EDGE_HIDE_TRITON", "bool", True,
    "In `run`'s own process, mark an installed Triton without a CPU backend as absent before "
    "torch is imported (runtime/triton_hide.py): vLLM disables such a Triton on CPU anyway, and "
    "importing it and hashing it for Inductor cost time at every start. 0: import it as usual.",
    "benchmarks/results/startup/: a warm `run` start with and without it; "
    "tests/runtime/test_triton_hide.py: torch and vLLM import without it and `run` still answers.",
)
_declare(
    "VLLM_EDGE_TIMELINE", "path", None,
    "When set, every process appends its startup phases (interpreter, imports, config, "
    "tokenizer, weights, AOT load, KV allocation, warm-up, first token) to this JSONL file; "
    "`vllm-edge bench startup` sets it. Off: nothing is wrapped.",
    "Measurement only; common/timeline.py wraps vLLM's startup steps just when it is set.",
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
    "\"amx_tile\", \"amx_int8\"]}. A given isa replaces the probed flags (missing flags are "
    "false; our names or raw /proc/cpuinfo names); omitted fields keep their probed values. "
    "Thread counts still follow the real allowed cores.",
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
    "pp512 and tg128), results in benchmarks/results/grid/rmsnorm/summary.json, NOT A RANKING; "
    "isolated timings in benchmarks/results/rmsnorm_micro.json. Inductor already fuses the "
    "native norm with the residual add (docs/design/patches.md).",
)
_declare(
    "VLLM_EDGE_INT4_OPENMP", "bool", False,
    "cpu_int4 prefill on the dequantize route (no AVX512-BF16, VLLM_EDGE_INT4_GEMV=0, or an "
    "integer dequant_threshold): split the native dequantization over torch's own OpenMP team "
    "(quant/native.py, needs the -fopenmp build) instead of Python threads. Read once per process.",
    "Off until an end-to-end A/B on a quiet host ranks it. The only measurement so far, an "
    "unrecorded 2-thread microbenchmark of the four SmolLM2 linears at 512 rows on a contended "
    "host, had the team slower than the Python threads; at 1 thread the routes are the same code. "
    "A/B: `bench speed --quant cpu_int4` with and without it.",
)
_declare(
    "VLLM_EDGE_LOWBIT", "bool", True,
    "cpu_int8: at load, repack a linear whose codes fit 5 or 6 bits (a GGUF's Q5_0, Q5_1, Q5_K "
    "and Q6_K) into the packed layout of quant/lowbit.py, read by the AVX512-BF16 product of "
    "quant/csrc/lowbit_gemv.c; 0 keeps every layer's row-major int8 codes. It changes the "
    "compiled graph and is not part of vLLM's compile-cache key: flip it with a fresh "
    "VLLM_CACHE_ROOT. Read once per process.",
    "On: the same values (lossless), about the file's bits per weight read instead of 8; the "
    "same-file comparisons with llama.cpp (docs/guide/models.md) ran it. Where the CPU lacks "
    "AVX512-BF16, VBMI, BW or BMI2 it has no effect.",
)
_declare(
    "VLLM_EDGE_INT4_ACT8", "bool", True,
    "The native product of cpu_int4: round each activation row to int8 per weight group, as "
    "llama.cpp does for a 4-bit block, and multiply with AVX512-VNNI's VPDPBUSD "
    "(quant/csrc/int4_gemv.c); 0 keeps the AVX512-BF16 product on the bf16 activations. Read "
    "when the kernel first loads. The edge engines set it and VLLM_EDGE_LOWBIT_ACT8 from the "
    "priority (runtime/activations.py: 1 at speed on an AVX512-VNNI CPU, 0 at fidelity) unless "
    "one is set in the environment.",
    "On: bench speed on the default build and the Gemma 3 file, both ACT8 switches on and off "
    "(benchmarks/results/grid/act8/intel-xeon-processor-amx-bf16-2-cores/), and bench step on "
    "the default build (benchmarks/results/step/intel-xeon-processor-amx-bf16-2-cores/), Intel "
    "Xeon AMX host; same-file fidelity "
    "against llama.cpp on the embedded GGUF, both positions "
    "(benchmarks/results/fidelity_vs_llamacpp_default_act8-*). On the AMD EPYC Zen 5 host the "
    "same grid (benchmarks/results/grid/act8/amd-epyc-family-26-2-avx512-bf16-2-cores/) and the "
    "Gemma 3 file's same-file fidelity, both positions "
    "(benchmarks/results/fidelity_vs_llamacpp_gemma3-270m-q4_k_m_own-types_act8-*). Where the "
    "CPU lacks AVX512-VNNI it has no effect. docs/design/cpu-int4.md says where it is not measured.",
)
_declare(
    "VLLM_EDGE_SCALE_PREFETCH", "int", 4,
    "Groups ahead that the decode products (cpu_int4's AVX-512 and AVX2 ones, cpu_int8's packed "
    "one) prefetch a weight block's scales and offsets, which sit one group's row apart and not "
    "beside the codes; 0 turns the prefetch off. Read when a kernel library loads.",
    "benchmarks/results/grid/scale_prefetch/: decode with 4 and 0, interleaved.",
    minimum=0,
)
_declare(
    "VLLM_EDGE_NGRAM_TOKENS", "int", 4,
    "Most tokens one n-gram prompt-lookup proposal holds (`--speculative ngram` and `auto`): "
    "each is checked in the next step, so a longer proposal gains more where the answer copies "
    "its input and widens the step where it does not.",
    "benchmarks/results/grid/ngram_tokens/: the grounded benchmark at 4, 6 and 8, interleaved.",
    minimum=1,
)
_declare(
    "VLLM_EDGE_LOWBIT_ACT8", "bool", True,
    "The packed product of cpu_int8 (a GGUF's 5-, 6- and 8-bit codes: Q5_0, Q5_1, Q5_K, Q6_K "
    "and Q8_0 layers and heads): round each activation row to int8 per weight group, as "
    "llama.cpp does for those blocks, and multiply with AVX512-VNNI's VPDPBUSD "
    "(quant/csrc/lowbit_gemv.c); 0 keeps the AVX512-BF16 products on the bf16 activations. "
    "Read when the kernel first loads.",
    "On: measured with VLLM_EDGE_INT4_ACT8, which names the artifacts; on the default build it "
    "moves the tied Q8_0 head, on the Gemma 3 file every layer but its Q4_K ones. Where the CPU "
    "lacks AVX512-VNNI it has no effect.",
)
_declare(
    "VLLM_EDGE_ONE_KV_GROUP", "bool", True,
    "For a model that mixes sliding-window and full-attention layers (Gemma 3, Gemma 2): the "
    "edge engines put every layer in one KV cache group (vLLM's disable_hybrid_kv_cache_manager) "
    "when they priced the KV budget themselves, flat, so the attention metadata is built once a "
    "step instead of once per group; the CPU attention still applies each layer's window "
    "(runtime/kv_groups.py). 0 keeps vLLM's hybrid manager. Read when the engine arguments are "
    "made.",
    "On: bench step and bench speed on the Gemma 3 270M file with the switch on and off, "
    "interleaved (benchmarks/results/grid/kv_groups_step/, benchmarks/results/grid/kv_groups/): "
    "the runner's input preparation is shorter with one group, and no metric is worse outside "
    "the noise; "
    "log-probabilities and greedy tokens past the window equal transformers' float32 ones in "
    "both positions (tests/runtime/test_kv_groups_engine.py).",
)
_declare(
    "VLLM_EDGE_INT4_GEMV", "bool", True,
    "cpu_int4: run batches up to the dequantization threshold (with dequant_threshold "
    "\"auto\", every batch) on the native AVX512-BF16 product (quant/csrc/int4_gemv.c); where "
    "torch packs 32-row blocks (no AVX-512), batches up to 48 rows on the AVX2 product "
    "(quant/csrc/int4_gemv32.c). "
    "0 uses tinygemm (_weight_int4pack_mm_for_cpu) and hands over to dequantize + GEMM at 48 "
    "rows, the route before the kernels existed. Read once per process.",
    "On: faster than tinygemm at one row on the 1B shapes "
    "(benchmarks/results/cpu_int4_microbench_product_g{32,64}.json); the 1B grid "
    "(benchmarks/results/grid/int4_1b/summary.json) runs both settings side by side.",
)
_declare(
    "VLLM_EDGE_INT4_NATIVE_OP", "bool", True,
    "cpu_int4: layers whose every batch runs the native product (bf16, N % 64 == 0, K % 32 == 0, "
    "dequant_threshold \"auto\" or prefill_dequant off, no plain copy) call the C++ dispatcher op "
    "torch.ops.vllm_edge.int4_gemv (quant/csrc/int4_op.cpp, built on first use and cached under "
    "VLLM_EDGE_HOME/kernels) instead of the Python custom op and ctypes. 0, or a failed build, "
    "keeps the Python op. It changes the compiled graph and is not part of vLLM's compile-cache "
    "key: flip it with a fresh VLLM_CACHE_ROOT (either graph runs correctly). Read once per process.",
    "On: same kernel, bit-identical output, without the Python round trip per call "
    "(tests/quant/test_native_op.py). Decode-step A/B in benchmarks/results/grid/step_core "
    "(arm \"no native op\"): the op's call path at one row and the forward medians favour it; "
    "on the shared host the ranges overlap.",
)

# --- names owned by other projects that we read -----------------------------
_declare(
    "VLLM_CACHE_ROOT", "path", "~/.cache/vllm",
    "vLLM's cache root; its torch_compile_cache holds the AOT artifacts.",
    "vLLM's own default.", owner="vllm",
)
_declare(
    "XDG_CACHE_HOME", "path", "~/.cache",
    "The user's cache directory; vLLM's cache root is its `vllm` folder when VLLM_CACHE_ROOT is "
    "unset, and the keep-alive server's compiled-graph markers name files there.",
    "vLLM's own rule (vllm/envs.py: get_default_cache_root).", owner="xdg",
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
    "Quiet 2-core host: 2 threads in one process decode faster than vLLM's multiprocess "
    "executor with 1 (benchmarks/results/grid/edge_mode_quiet/summary.json). On a contended host "
    "the 2 OpenMP threads wait on each other and the ranking vanished "
    "(benchmarks/results/grid/edge_mode/summary.json, NOT A RANKING).",
    minimum=1
)

_declare(
    "VLLM_EDGE_MAX_IMAGE_BYTES", "int", 20 << 20,
    "Largest image input, in encoded bytes (file or data URL), that `run --image` and the "
    "image validation for `serve` accept (runtime/images.py); larger ones get a clear error "
    "(HTTP 413) before any decode.",
    "20 MiB covers a full-resolution phone JPEG; the processor resizes every image to the "
    "encoder's 512-pixel tile anyway, so larger inputs only cost memory and decode time.",
    minimum=1
)
_declare(
    "VLLM_EDGE_MAX_IMAGE_PIXELS", "int", 4096 * 4096,
    "Largest image input in pixels (width x height, read from the header before decoding), "
    "for `run --image` and the request gate of `serve`.",
    "A 16-megapixel RGB image decodes to 48 MiB; this bounds the decode on a small device "
    "and stops decompression bombs well below PIL's own 89 M-pixel warning.",
    minimum=1
)
_declare(
    "VLLM_EDGE_MAX_BODY_BYTES", "int", 0,
    "Largest request body `serve` reads (serving/gate.py); a larger one gets HTTP 413 before "
    "it is buffered. 0: 4 MiB of text, plus one base64 image at VLLM_EDGE_MAX_IMAGE_BYTES for "
    "a model that takes images.",
    "A 2048-token context is under 100 KB of text; without a cap a client could make the "
    "server buffer any amount before a check (tests/serving/test_gate.py).",
    minimum=0,
)
_declare(
    "VLLM_EDGE_SCHEMA_COMPILE_S", "int", 10,
    "Seconds the request gate of `serve` lets xgrammar spend compiling one request's JSON "
    "schemas, regexes and grammars (in a worker process, on one thread); over it the request "
    "gets HTTP 400 naming this limit. 0 turns the check off.",
    "A few hundred bytes of schema can cost minutes of the engine's compile thread "
    "(serving/gate_compile.py; the schema_compile_time probe in "
    "benchmarks/results/security/probes.json).",
    minimum=0,
)
_declare(
    "VLLM_EDGE_MAX_IMAGES", "int", 4,
    "Images allowed in one prompt (`run --image`, the request gate of `serve`); also vLLM's "
    "`limit_mm_per_prompt` for image models, whose own default is 999.",
    "With the default VLM build one image is 67 prompt tokens, so 4 leave most of a "
    "2048-token context for text; vLLM also sizes its encoder-cache profile from this limit.",
    minimum=1
)

_declare(
    "VLLM_CPU_OMP_THREADS_BIND", "str", None,
    "vLLM's per-rank core binding on CPU ('0-3|4-7', 'auto', 'nobind'). With more than one "
    "rank on a machine the edge mode sets it to an even split of the allowed cores; a value "
    "the user set (other than 'auto') is kept.",
    "vLLM's 'auto' gives each rank a NUMA node of its own and refuses to start when there are "
    "fewer nodes than ranks, as on a one-socket box (tests/runtime/test_parallel_engine.py).",
    owner="vllm",
)
_declare(
    "VLLM_CPU_ATTN_SPLIT_KV", "bool", None,
    "vLLM's own switch (its default: on): its CPU attention shares a lone query token's keys "
    "between the threads and merges the parts. The edge engines set 0 where each thread has "
    "a KV head of its own without it, so that a plain step and a speculative verification "
    "step give a sequence's rows the same bits; a value the user set is kept.",
    "Greedy answers with and without speculation are the same with it off and part at near "
    "ties with it on (tests/runtime/test_speculative_engine.py); off, the default build "
    "decoded as fast and the one-KV-head Gemma 3 file slower, both inside the noise "
    "(benchmarks/results/grid/attention_split/).",
    owner="vllm",
)
_declare(
    "VLLM_USE_LAYERNAME", "bool", None,
    "vLLM's own switch: on torch 2.11 and later its attention and KV-cache ops take the layer "
    "name as an opaque Python object (1, vLLM's default) or as a string (0). Compiled engines "
    "set 0 for the C++ wrapper (VLLM_EDGE_CPP_WRAPPER); a value the user set is kept, and 1 "
    "then keeps Inductor's Python wrapper.",
    "vllm/utils/torch_utils.py (LayerName); Inductor's C++ wrapper refuses a PyObject argument "
    "of a custom op (tests/runtime/test_cpp_wrapper.py).", owner="vllm",
)
_declare(
    "TORCHINDUCTOR_VEC_ISA_OK", "str", None,
    "Inductor's own switch: 1 uses the CPU's advertised vector ISAs without testing them, 0 "
    "none. Read only to leave it alone: when the user set it, the remembered ISA probe "
    "(VLLM_EDGE_ISA_PROBE_CACHE) does nothing.",
    "torch/_inductor/config.py (cpp.vec_isa_ok).", owner="torch",
)
_declare(
    "CXX", "str", None,
    "The C++ compiler Inductor builds with; part of the key of the remembered ISA probe, so "
    "another compiler is probed again.",
    "torch/_inductor/cpp_builder.py reads it to pick the compiler.", owner="toolchain",
)
_declare(
    "OMP_NUM_THREADS", "int", None,
    "OpenMP thread count, set (never read for a decision) before torch or vLLM is imported: "
    "`bench speed` sets it to the size of its core set; the edge mode of `run` to the number "
    "of allowed cores in one-process mode, where vLLM's own thread binding does not run.",
    "vLLM's multiprocess CPU worker binds one thread per core but reserves one core for the "
    "frontend; on 2 cores that leaves 1 compute thread.", owner="openmp",
    minimum=1
)


_DOC_HEAD = """# Configuration

_Generated from `src/vllm_edge/envs.py` by `python -m vllm_edge.envs`; `tests/test_envs.py` fails
when this page differs from what it renders. Edit the declarations, not this page._

Every environment variable vllm-edge reads is declared once in `src/vllm_edge/envs.py`, with its
type, default, meaning and the evidence for the default. `vllm-edge doctor` prints the ones set in
your shell. A test fails if `src/` reads a name that is not declared.
"""

_DOC_SECTIONS = (("vllm-edge", "Our switches"), ("vllm", "Names owned by vLLM that we read or set"),
                 ("openmp", "Names owned by OpenMP that we set"),
                 ("torch", "Names owned by torch that we read"),
                 ("toolchain", "Names owned by the build toolchain that we read"),
                 ("xdg", "Names of the XDG base directories that we read"))


def _doc_default(var: EnvVar) -> str:
    if var.default is None:
        return "unset"
    if var.type == "bool":
        return "`1`" if var.default else "`0`"
    return f"`{var.default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """docs/reference/configuration.md, rendered from the declarations (one table per owner)."""
    out = [_DOC_HEAD]
    for owner, title in _DOC_SECTIONS:
        vars_ = [v for v in DECLARED.values() if v.owner == owner]
        if not vars_:
            continue
        out += [f"## {title}", "", "| variable | type | default | meaning | evidence for the default |",
                "|---|---|---|---|---|"]
        out += [f"| `{v.name}` | {v.type} | {_doc_default(v)} | {_cell(v.meaning)} | {_cell(v.evidence)} |"
                for v in vars_]
        out.append("")
    unknown = sorted({v.owner for v in DECLARED.values()} - {o for o, _ in _DOC_SECTIONS})
    if unknown:
        raise RuntimeError(f"no configuration.md section for owners {unknown}")
    return "\n".join(out)


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
            value = int(raw)
        except ValueError:
            raise ValueError(f"{var.name}={raw!r}: expected an integer") from None
        if var.minimum is not None and value < var.minimum:
            raise ValueError(f"{var.name}={raw!r}: must be at least {var.minimum}")
        return value
    if var.type == "path":
        if not raw.strip():
            raise ValueError(f"{var.name}={raw!r}: expected a directory path")
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


def problems() -> list[str]:
    """What is wrong with the declared variables set in this process, one line each naming
    the variable (``doctor`` exits 1 on any). A path must be a directory or creatable."""
    found = []
    for name in sorted(DECLARED):
        if name not in os.environ:
            continue
        try:
            value = get(name)
        except ValueError as exc:
            found.append(str(exc))
            continue
        if DECLARED[name].type == "path":
            existing = next((p for p in (value, *value.parents) if p.exists()), None)
            if existing is not None and not existing.is_dir():
                found.append(f"{name}={os.environ[name]!r}: {existing} is a file, not a directory")
            elif existing is not None and not os.access(existing, os.W_OK):
                found.append(f"{name}={os.environ[name]!r}: {existing} is not writable")
    return found


def in_effect() -> dict[str, str]:
    """Declared variables that are set in this process, with their raw values."""
    return {name: os.environ[name] for name in sorted(DECLARED) if name in os.environ}


def home() -> Path:
    return get("VLLM_EDGE_HOME")


if __name__ == "__main__":
    print(markdown(), end="")
