"""README's "Measured so far": every figure read from its artifact, never typed by hand.

:data:`CLAIMS` is the table of what README quotes: a label, the artifact (relative to the
results directory; ``file.jsonl:N`` is line N), the key path to the value and its format.
A value is a number, or a stats dict from :mod:`vllm_edge.common.stats` (its median is shown,
its flags with it). ``per`` makes the figure a ratio of two values, ``minus`` a difference;
``target`` adds a met / not met verdict next to the flags, so no verdict hides its noise.

:func:`render` turns the table into the README region between :data:`BEGIN` and :data:`END`;
:func:`vllm_edge.bench.report.results.splice_readme` writes it (`vllm-edge report` calls it).
``tests/test_docs_numbers.py`` re-renders and fails when the committed README differs.
"""

from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_edge.quant.formats.cpu_int4 import NAME as CPU_INT4
from vllm_edge.quant.formats.gptq import NAME as GPTQ
from vllm_edge.quant.groups import DEFAULT_GROUP

BEGIN = "<!-- measured:begin -->"
END = "<!-- measured:end -->"

Key = tuple[Any, ...]
# A value elsewhere: (artifact, key path). ``None`` artifact means the claim's own artifact.
Ref = tuple[str | None, Key]

_TARGET_OPS = {">=": (operator.ge, "≥"), "<=": (operator.le, "≤")}


@dataclass(frozen=True)
class Claim:
    section: str
    label: str
    artifact: str
    key: Key
    fmt: str
    per: Ref | None = None       # value / per
    minus: Ref | None = None     # value - minus
    target: tuple[str, float] | None = None  # (">=" or "<=", threshold) on the shown value
    # Flags the artifact's structure cannot carry (e.g. a lone cold start is one run).
    flags: tuple[str, ...] = ()


def _arm(metric: str, arm: str) -> Key:
    return ("metrics", metric, "arms", arm)


_LEVERS = "grid/levers/summary.json"
_GROUP = "grid/group/summary.json"
_1B = "grid/int4_1b/summary.json"
_CMP = "compare/speed/summary.json"
_VLM = "grid/vlm/summary.json"
_RMS = "grid/rmsnorm/summary.json"
_STEP = "grid/step_core/summary.json"
_STEP_LEVERS = "grid/step_levers/summary.json"
_CMP_1B = "compare_1b/speed/summary.json"
_X = "{:.2f}×"

CLAIMS: tuple[Claim, ...] = (
    # Start-up: the aot_cache patch (docs/design/patches.md)
    Claim("Start-up", "engine init, warm start with `aot_cache` (median)", "aot_cache.json",
          ("summary", "warm_init_engine_s_median"), "{:.1f} s"),
    Claim("Start-up", "engine init, cold start", "aot_cache.json", ("summary", "cold_init_engine_s"),
          "{:.1f} s", flags=("single pass",)),
    Claim("Start-up", "engine init, stock vLLM on the same warm cache (recompiles)", "aot_cache.json",
          ("summary", "unpatched_init_engine_s"), "{:.1f} s", flags=("single pass",)),
    # Stock vLLM against the edge mode, one lever off per arm (docs/design/edge-levers.md)
    Claim("Stock vs edge (bf16)", "ready, stock vLLM 0.32.0", _LEVERS, _arm("ready_s", "stock vLLM"), "{:.1f} s"),
    Claim("Stock vs edge (bf16)", "ready, edge mode", _LEVERS, _arm("ready_s", "edge (all levers)"), "{:.1f} s"),
    Claim("Stock vs edge (bf16)", "peak tree RssAnon, stock vLLM", _LEVERS,
          _arm("peak_tree_rss_anon_mb", "stock vLLM"), "{:.0f} MB"),
    Claim("Stock vs edge (bf16)", "peak tree RssAnon, edge mode", _LEVERS,
          _arm("peak_tree_rss_anon_mb", "edge (all levers)"), "{:.0f} MB"),
    Claim("Stock vs edge (bf16)", "settled tree RssAnon, edge mode", _LEVERS,
          _arm("settled_tree_rss_anon_mb", "edge (all levers)"), "{:.0f} MB"),
    Claim("Stock vs edge (bf16)", "ready: AOT fix (edge − edge without it)", _LEVERS,
          _arm("ready_s", "edge (all levers)"), "{:+.1f} s",
          minus=(None, _arm("ready_s", "edge without aot_cache"))),
    Claim("Stock vs edge (bf16)", "ready: one process (edge − edge without it)", _LEVERS,
          _arm("ready_s", "edge (all levers)"), "{:+.1f} s",
          minus=(None, _arm("ready_s", "edge without one-process"))),
    Claim("Stock vs edge (bf16)", "peak RssAnon: one process (edge − edge without it)", _LEVERS,
          _arm("peak_tree_rss_anon_mb", "edge (all levers)"), "{:+.0f} MB",
          minus=(None, _arm("peak_tree_rss_anon_mb", "edge without one-process"))),
    Claim("Stock vs edge (bf16)", "peak RssAnon: KV priced from the config (edge − edge without it)", _LEVERS,
          _arm("peak_tree_rss_anon_mb", "edge (all levers)"), "{:+.0f} MB",
          minus=(None, _arm("peak_tree_rss_anon_mb", "edge without KV pricing"))),
    Claim("Stock vs edge (bf16)", "settled RssAnon: arena release (edge − edge without it)", _LEVERS,
          _arm("settled_tree_rss_anon_mb", "edge (all levers)"), "{:+.0f} MB",
          minus=(None, _arm("settled_tree_rss_anon_mb", "edge without arena release"))),
    Claim("Stock vs edge (bf16)", "settled tree RssAnon, cpu_int4 warm start", "init_memory_cpu_int4.jsonl:3",
          ("settled_tree_rss_anon_mb",), "{:.0f} MB", flags=("single pass",)),
    # cpu_int4 against bf16 on the default model (docs/design/cpu-int4.md)
    Claim("cpu_int4 vs bf16 (default model)", "tg128, cpu_int4", "speed_default_cpu_int4.json",
          ("metrics", "tg128_tps"), "{:.1f} tok/s"),
    Claim("cpu_int4 vs bf16 (default model)", "tg128, bf16", "speed_default_bf16.json",
          ("metrics", "tg128_tps"), "{:.1f} tok/s"),
    Claim("cpu_int4 vs bf16 (default model)", "tg128, cpu_int4 / bf16", "speed_default_cpu_int4.json",
          ("metrics", "tg128_tps"), _X, per=("speed_default_bf16.json", ("metrics", "tg128_tps"))),
    Claim("cpu_int4 vs bf16 (default model)", "pp512, cpu_int4 / bf16", "speed_default_cpu_int4.json",
          ("metrics", "pp512_tps"), _X, per=("speed_default_bf16.json", ("metrics", "pp512_tps"))),
    Claim("cpu_int4 vs bf16 (default model)", "tg128, g32 / bf16, interleaved", _GROUP,
          _arm("tg128_tps", "cpu_int4 g32"), _X, per=(None, _arm("tg128_tps", "bf16"))),
    Claim("cpu_int4 vs bf16 (default model)", "tg128, g64 / bf16, interleaved", _GROUP,
          _arm("tg128_tps", "cpu_int4 g64"), _X, per=(None, _arm("tg128_tps", "bf16"))),
    Claim("cpu_int4 vs bf16 (default model)", "pp512, g32 / bf16, interleaved", _GROUP,
          _arm("pp512_tps", "cpu_int4 g32"), _X, per=(None, _arm("pp512_tps", "bf16"))),
    Claim("cpu_int4 vs bf16 (default model)", "pp512, g64 / bf16, interleaved", _GROUP,
          _arm("pp512_tps", "cpu_int4 g64"), _X, per=(None, _arm("pp512_tps", "bf16"))),
    # Fidelity against the model's own bf16 (docs/design/fidelity.md)
    Claim("Fidelity (default model, against its bf16)", "teacher-forced top-1", "fidelity_default_cpu_int4_g32.json",
          ("teacher_forced", "top1_agreement"), "{:.3f}"),
    Claim("Fidelity (default model, against its bf16)", "KL mean", "fidelity_default_cpu_int4_g32.json",
          ("teacher_forced", "kl_mean"), "{:.3f}"),
    Claim("Fidelity (default model, against its bf16)", "first-token agreement", "fidelity_default_cpu_int4_g32.json",
          ("greedy", "first_token_agreement"), "{:.2f}"),
    Claim("Fidelity (default model, against its bf16)", "teacher-forced top-1", "fidelity_default_cpu_int4.json",
          ("teacher_forced", "top1_agreement"), "{:.3f}"),
    Claim("Fidelity (default model, against its bf16)", "KL mean", "fidelity_default_cpu_int4.json",
          ("teacher_forced", "kl_mean"), "{:.3f}"),
    Claim("Fidelity (default model, against its bf16)", "first-token agreement", "fidelity_default_cpu_int4.json",
          ("greedy", "first_token_agreement"), "{:.2f}"),
    # serve (docs/guide/serve.md)
    Claim("serve soak", "requests in the soak", "soak_10min.json", ("requests",), "{}"),
    Claim("serve soak", "HTTP 5xx", "soak_10min.json", ("http_5xx",), "{}"),
    Claim("serve soak", "server RssAnon spread after warm-up", "soak_10min.json",
          ("rss_anon", "spread_pct"), "{:.2f} %"),
    # The edge_cpu norm provider (docs/design/patches.md)
    Claim("RMSNorm provider", "tg128, edge_cpu / native, bf16", _RMS,
          _arm("tg128_tps", "bf16 edge_cpu"), _X, per=(None, _arm("tg128_tps", "bf16 native"))),
    Claim("RMSNorm provider", "tg128, edge_cpu / native, cpu_int4", _RMS,
          _arm("tg128_tps", "cpu_int4 edge_cpu"), _X, per=(None, _arm("tg128_tps", "cpu_int4 native"))),
    # Synthetic 1B Llama (docs/design/cpu-int4.md)
    Claim("Synthetic 1B", "tg128, cpu_int4 g64 / bf16", _1B, _arm("tg128_tps", "cpu_int4 g64"), _X,
          per=(None, _arm("tg128_tps", "bf16")), target=(">=", 2.5)),
    Claim("Synthetic 1B", "tg128, cpu_int4 g64 / vLLM's in-tree GPTQ", _1B, _arm("tg128_tps", "cpu_int4 g64"), _X,
          per=(None, _arm("tg128_tps", "cpu_gptq g64")), target=(">=", 1.5)),
    Claim("Synthetic 1B", "pp512, cpu_int4 g64 / bf16", _1B, _arm("pp512_tps", "cpu_int4 g64"), _X,
          per=(None, _arm("pp512_tps", "bf16")), target=(">=", 0.9)),
    Claim("Synthetic 1B", "tg128, cpu_int4 g32 / bf16", _1B, _arm("tg128_tps", "cpu_int4 g32"), _X,
          per=(None, _arm("tg128_tps", "bf16"))),
    Claim("Synthetic 1B", "tg128, native product / tinygemm (g64)", _1B, _arm("tg128_tps", "cpu_int4 g64"), _X,
          per=(None, _arm("tg128_tps", "cpu_int4 g64 tinygemm"))),
    # The decode step, batch 1, compiled (docs/design/decode-step.md)
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "ms per step, before the decode-step levers (the code at 4f0229d)",
          _STEP, _arm("step_ms", "before"), "{:.2f} ms"),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "ms per step, with them", _STEP,
          _arm("step_ms", "after"), "{:.2f} ms"),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "ms per step outside the forward, with them",
          _STEP, _arm("outside_forward_ms", "after"), "{:.2f} ms", target=("<=", 1.0)),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "Python-implemented op calls per step, before",
          _STEP, _arm("python_op_calls_per_step", "before"), "{:.0f}"),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "Python-implemented op calls per step, after",
          _STEP, _arm("python_op_calls_per_step", "after"), "{:.0f}"),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "forward: C++ int4 op / Python int4 op", _STEP,
          _arm("forward_ms", "after"), _X, per=(None, _arm("forward_ms", "no native op"))),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "forward: one attention op / two", _STEP,
          _arm("forward_ms", "after"), _X, per=(None, _arm("forward_ms", "no fused attention"))),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "sampler: greedy fast path / vLLM's (left off)",
          _STEP_LEVERS, _arm("sampler_ms", "after"), _X, per=(None, _arm("sampler_ms", "no greedy fast path"))),
    Claim("Decode step (SmolLM2 cpu_int4 g32, compiled, batch 1)", "step: OMP_WAIT_POLICY=PASSIVE / default (left off)",
          _STEP_LEVERS, _arm("step_ms", "after + OMP passive"), _X, per=(None, _arm("step_ms", "after"))),
    # llama.cpp side by side (docs/results/comparisons.md has every table)
    Claim("llama.cpp side by side", "tg128, vLLM cpu_int4 / Q4_K_M", _CMP, _arm("tg128_tps", "vllm-cpu_int4"), _X,
          per=(None, _arm("tg128_tps", "llamacpp-Q4_K_M")), target=(">=", 1.0)),
    Claim("llama.cpp side by side", "tg128, vLLM cpu_int4 / Q4_0", _CMP, _arm("tg128_tps", "vllm-cpu_int4"), _X,
          per=(None, _arm("tg128_tps", "llamacpp-Q4_0"))),
    Claim("llama.cpp side by side", "pp512, vLLM cpu_int4 / Q4_K_M", _CMP, _arm("pp512_tps", "vllm-cpu_int4"), _X,
          per=(None, _arm("pp512_tps", "llamacpp-Q4_K_M"))),
    Claim("llama.cpp side by side", "batch-8 decode, vLLM cpu_int4 / Q4_K_M", _CMP,
          _arm("b8_tg_tps", "vllm-cpu_int4"), _X, per=(None, _arm("b8_tg_tps", "llamacpp-Q4_K_M"))),
    Claim("llama.cpp side by side, synthetic 1B", "tg128, vLLM cpu_int4 g32 / Q4_K_M", _CMP_1B,
          _arm("tg128_tps", "vllm-cpu_int4"), _X, per=(None, _arm("tg128_tps", "llamacpp-Q4_K_M")),
          target=(">=", 1.2)),
    Claim("llama.cpp side by side, synthetic 1B", "tg128, vLLM cpu_int4 g64 / Q4_K_M", _CMP_1B,
          _arm("tg128_tps", "vllm-cpu_int4-g64"), _X, per=(None, _arm("tg128_tps", "llamacpp-Q4_K_M"))),
    Claim("llama.cpp side by side, synthetic 1B", "batch-8 decode, vLLM cpu_int4 g32 / Q4_K_M", _CMP_1B,
          _arm("b8_tg_tps", "vllm-cpu_int4"), _X, per=(None, _arm("b8_tg_tps", "llamacpp-Q4_K_M")),
          target=(">=", 2.0)),
    Claim("llama.cpp side by side", "ready, vLLM cpu_int4", _CMP, _arm("load_s", "vllm-cpu_int4"), "{:.1f} s"),
    Claim("llama.cpp side by side", "ready, llama.cpp Q4_K_M", _CMP, _arm("load_s", "llamacpp-Q4_K_M"), "{:.1f} s"),
    Claim("llama.cpp side by side", "peak RssAnon, vLLM cpu_int4 / Q4_K_M", _CMP,
          _arm("peak_rss_anon_mb", "vllm-cpu_int4"), _X, per=(None, _arm("peak_rss_anon_mb", "llamacpp-Q4_K_M"))),
    Claim("VLM (one 512×512 image)", "peak RssAnon, bf16", _VLM, _arm("peak_rss_anon_mb", "bf16"), "{:.0f} MB"),
    Claim("VLM (one 512×512 image)", "peak RssAnon, cpu_int4 g32", _VLM,
          _arm("peak_rss_anon_mb", "cpu_int4 g32"), "{:.0f} MB"),
    Claim("VLM (one 512×512 image)", "peak RssAnon, cpu_int4 g64", _VLM,
          _arm("peak_rss_anon_mb", "cpu_int4 g64"), "{:.0f} MB"),
    Claim("VLM (one 512×512 image)", "peak RssAnon, cpu_int4 g64 with the vision tower in 4-bit", _VLM,
          _arm("peak_rss_anon_mb", "cpu_int4 g64 + vision"), "{:.0f} MB"),
    Claim("VLM (one 512×512 image)", "tg64 after the image, cpu_int4 g32 / bf16", _VLM,
          _arm("tg64_img_tps", "cpu_int4 g32"), _X, per=(None, _arm("tg64_img_tps", "bf16"))),
    # Agent suite against serve (docs/guide/agent.md)
    Claim("Agent suite against `serve`", "tasks passed, bf16", "agent/agent_suite_bf16.json",
          ("summary",), "{passed}/{runs}"),
    Claim("Agent suite against `serve`", "tasks passed, cpu_int4", "agent/agent_suite_cpu_int4.json",
          ("summary",), "{passed}/{runs}"),
)


# --- reading -------------------------------------------------------------------

def load(results_dir: Path, artifact: str) -> dict:
    """An artifact by its claim name: ``file.json`` or ``file.jsonl:N`` (line N, from 1)."""
    name, _, line = artifact.partition(":")
    text = (results_dir / name).read_text()
    if line:
        rows = [json.loads(r) for r in text.splitlines() if r.strip()]
        row = dict(rows[int(line) - 1])
        # A JSONL run records its provenance once, on a line of its own.
        head = next((r for r in rows if set(r) == {"provenance"}), None)
        if head and "provenance" not in row:
            row["provenance"] = head["provenance"]
        return row
    return json.loads(text)


def _get(data: Any, key: Key, where: str) -> Any:
    for k in key:
        try:
            data = data[k]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{where}: no key {k!r} on the path {key!r}") from None
    return data


def _number(v: Any) -> tuple[Any, list[str]]:
    """(value, flags) of a number or a stats dict."""
    if isinstance(v, dict) and "median" in v:
        return v["median"], list(v.get("flags") or [])
    return v, []


def _arm_build(data: dict, key: Key) -> str | None:
    """The build a grid arm ran: model, quantization and env from the arm's own command."""
    if len(key) < 4 or key[0] != "metrics" or key[2] != "arms":
        return None
    arm = next((a for a in data.get("arms") or [] if a.get("name") == key[3]), None)
    if arm is None:
        return None
    cmd = [str(c) for c in arm.get("cmd") or []]

    def flag(name: str) -> str | None:
        return cmd[cmd.index(name) + 1] if name in cmd and cmd.index(name) + 1 < len(cmd) else None

    model = flag("--model") or flag("--gguf") or flag("--cand")
    name = Path(model).name if model else "default"
    parts = [name]
    quant, group = flag("--quant"), flag("--group")
    if quant is None and cmd[3:5] == ["bench", "step"]:
        quant, group = CPU_INT4, group or str(DEFAULT_GROUP)  # `bench step`'s own default
    if quant:
        parts.append(f"{quant} g{group}" if group else quant)
    elif not any(q in name for q in (CPU_INT4, GPTQ, ".gguf")):
        parts.append("bf16")
    # PYTHONPATH names a checkout on the measuring host; the claim's label says which code it is
    parts += [f"{k}={v}" for k, v in sorted((arm.get("env") or {}).items()) if k != "PYTHONPATH"]
    return " ".join(parts)


def _prov_build(data: dict) -> str:
    """The build of a one-run artifact, from its provenance: model and quantization config."""
    prov = data.get("provenance") or {}
    model = prov.get("model") or {}
    if not model.get("path"):
        # A client's artifact (the agent suite) names only the model it asked the server for.
        served = prov.get("served_model") or data.get("model")
        return f"served model `{served}`" if served else "unrecorded model"
    name = Path(model["path"]).name
    qc = model.get("quantization_config")
    if qc:
        return f"{name} ({qc.get('quant_method')} g{qc.get('group_size')})"
    return f"{name} (bf16)"


def _host(data: dict) -> str | None:
    prov = data.get("provenance") or {}
    cpu = (prov.get("cpu") or {}).get("model")
    cores = prov.get("core_set") or prov.get("target_cores")
    if not cpu:
        return None
    return f"{cpu}, cores {','.join(map(str, cores))}" if cores else cpu


@dataclass
class Figure:
    claim: Claim
    text: str
    flags: list[str]
    build: str
    host: str | None


def evaluate(claim: Claim, results_dir: Path) -> Figure:
    data = load(results_dir, claim.artifact)
    value, flags = _number(_get(data, claim.key, claim.artifact))
    grid = isinstance(data.get("arms"), list)
    builds = [_arm_build(data, claim.key) if grid else _prov_build(data)]
    other = claim.per or claim.minus
    if other:
        o_art = other[0] or claim.artifact
        o_data = data if o_art == claim.artifact else load(results_dir, o_art)
        o_value, o_flags = _number(_get(o_data, other[1], o_art))
        flags += [f for f in o_flags if f not in flags]
        o_grid = isinstance(o_data.get("arms"), list)
        builds.append(_arm_build(o_data, other[1]) if o_grid else _prov_build(o_data))
        if o_art != claim.artifact:
            flags.append("separate runs, not interleaved")
        value = value / o_value if claim.per else value - o_value
    if grid and data.get("busy_passes"):
        flags.append(f"busy passes {data['busy_passes']}")
    flags += [f for f in claim.flags if f not in flags]
    text = claim.fmt.format(**value) if isinstance(value, dict) else claim.fmt.format(value)
    if claim.target:
        op, threshold = claim.target
        test, sign = _TARGET_OPS[op]
        text += f" (target {sign} {threshold:g}: {'met' if test(value, threshold) else 'not met'})"
    build = " / ".join(b or "?" for b in builds) if len(set(builds)) > 1 else (builds[0] or "?")
    return Figure(claim, text, flags, build, _host(data))


# --- writing -------------------------------------------------------------------

def render(results_dir: str | os.PathLike, readme: str | os.PathLike) -> str:
    """The README region (without the markers): one table per section."""
    rdir, readme_path = Path(results_dir), Path(readme)
    figs = [evaluate(c, rdir) for c in CLAIMS]
    hosts = sorted({f.host for f in figs if f.host})
    lines = ["_Generated by `vllm-edge report` from the artifacts below (the claims are "
             "`CLAIMS` in `src/vllm_edge/bench/report/claims.py`); do not edit by hand._", "",
             "Hosts (from each artifact's provenance): " + "; ".join(hosts) + ". Flags: `NOISY` "
             "spread over the threshold, `NOT A RANKING` inside another arm's spread, `single pass`, "
             "busy passes, or builds from separate runs: read those figures as directions only. "
             "Tables with every figure: [docs/results/results.md](docs/results/results.md).", ""]
    section = None
    for f in figs:
        if f.claim.section != section:
            section = f.claim.section
            if lines[-1]:
                lines.append("")
            lines += [f"**{section}**", "", "| figure | value | flags | build | artifact |",
                      "|---|---|---|---|---|"]
        link = os.path.relpath(rdir / f.claim.artifact.partition(":")[0], readme_path.parent)
        shown = f.claim.artifact
        lines.append(f"| {f.claim.label} | {f.text} | {'; '.join(f.flags) or '–'} | {f.build} | "
                     f"[{shown}]({link}) |")
    return "\n".join(lines).rstrip() + "\n"
