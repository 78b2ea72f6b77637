"""`vllm-edge bench rmsnorm`: both norm ops in isolation, provider against native.

Arms, at the default model's hidden size and epsilon, 1 row (decode) and 512 rows (pp512):

* ``native``: vLLM's native impl in eager torch (what ``enforce_eager`` runs);
* ``native_compiled``: the same function through ``torch.compile`` (inductor fuses
  the residual add into the norm, as it does inside the compiled engine);
* ``edge_cpu``: the provider's impl, as vLLM's dispatch calls it (the fused op in place).

Arms rotate inside every pass so load swings hit all of them; each sample is the
mean over a burst of calls, and best/median/spread come from :mod:`stats` over passes.
Isolation is not the verdict: the end-to-end grid (benchmarks/specs/rmsnorm.json) is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from vllm_edge.common import stats
from vllm_edge.common.timing import per_call_us

ROWS = (1, 512)
ARMS = ("native", "native_compiled", "edge_cpu")


def _burst(fn: Callable[[], object], target_s: float = 0.02) -> int:
    """Calls per sample so that one sample lasts about ``target_s``."""
    wall_us, _ = per_call_us(fn, 20)
    return max(20, int(target_s * 1e6 / max(wall_us, 0.05)))


def _arms(op_name: str, rows: int, hidden: int, eps: float, dtype) -> dict[str, Callable[[], object]]:
    import torch
    from vllm import ir

    from vllm_edge.kernels import rms_norm

    rms_norm.register()
    op = getattr(ir.ops, op_name)
    native = op.impls["native"].impl_fn
    provider = op.impls[rms_norm.PROVIDER].impl_fn
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    compiled = torch.compile(native, dynamic=False, fullgraph=True)
    if op_name == "rms_norm":
        args = (x, w, eps)
        if not op.impls[rms_norm.PROVIDER].supports_args(*args):
            raise ValueError(f"{rms_norm.PROVIDER} does not take {op_name} at hidden={hidden}")
        return {"native": lambda: native(*args), "native_compiled": lambda: compiled(*args),
                "edge_cpu": lambda: provider(*args)}
    r = torch.randn(rows, hidden, generator=g).to(dtype)
    # The provider updates its inputs in place; give it its own pair so the
    # functional arms always see the same values.
    xp, rp = x.clone(), r.clone()
    if not op.impls[rms_norm.PROVIDER].supports_args(xp, rp, w, eps):
        raise ValueError(f"{rms_norm.PROVIDER} does not take {op_name} at hidden={hidden}")
    return {"native": lambda: native(x, r, w, eps), "native_compiled": lambda: compiled(x, r, w, eps),
            "edge_cpu": lambda: provider(xp, rp, w, eps)}


def run(model: str = "default", passes: int = 15, threads: int | None = None,
        rows: tuple[int, ...] = ROWS, log: Callable[[str], None] = print) -> dict:
    import torch

    from vllm_edge.models.resolver import ensure_model

    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    path = Path(ensure_model(model))
    cfg = json.loads((path / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    hidden, eps = int(cfg["hidden_size"]), float(cfg.get("rms_norm_eps", 1e-6))
    dtype = torch.bfloat16
    results = []
    for op_name in ("rms_norm", "fused_add_rms_norm"):
        for m in rows:
            arms = _arms(op_name, m, hidden, eps, dtype)
            for fn in arms.values():  # compile and warm outside the timing
                for _ in range(3):
                    fn()
            reps = {a: _burst(fn) for a, fn in arms.items()}
            wall: dict[str, list[float]] = {a: [] for a in arms}
            cpu: dict[str, list[float]] = {a: [] for a in arms}
            names = list(arms)
            for i in range(passes):
                for a in names[i % len(names):] + names[:i % len(names)]:
                    w_us, c_us = per_call_us(arms[a], reps[a])
                    wall[a].append(w_us)
                    cpu[a].append(c_us)
            summ = {a: stats.summarize(v, "call_us") for a, v in wall.items()}
            med = {a: s["median"] for a, s in summ.items()}
            vs_compiled = stats.rank({a: dict(summ[a]) for a in ("native_compiled", "edge_cpu")}, "call_us")
            row = {
                "op": op_name, "rows": m, "hidden": hidden, "dtype": "bfloat16", "epsilon": eps,
                "calls_per_sample": reps, "wall_us": summ,
                "median_cpu_us": {a: round(stats.summarize(v, "cpu_us")["median"], 3) for a, v in cpu.items()},
                "speedup_vs_native": round(med["native"] / med["edge_cpu"], 3),
                "speedup_vs_native_compiled": round(med["native_compiled"] / med["edge_cpu"], 3),
                "edge_cpu_vs_native_compiled": vs_compiled,
                "samples_us": {a: [round(v, 3) for v in vs] for a, vs in wall.items()},
            }
            results.append(row)
            log(f"{op_name:<19} rows={m:<4} " + "  ".join(
                f"{a}={med[a]:8.2f}us (±{summ[a]['spread_pct']:.0f}%)" for a in names)
                + f"  native/edge={row['speedup_vs_native']}  compiled/edge={row['speedup_vs_native_compiled']}"
                + (f"  [{' | '.join(vs_compiled['flags'])}]" if vs_compiled["flags"] else ""))
    return {"benchmark": "rmsnorm_micro", "model": str(path), "passes": passes, "threads": threads,
            "arms": list(ARMS), "results": results}


def main(model: str, passes: int, threads: int | None, out: str | None) -> int:
    from vllm_edge.common import atomic, provenance

    result = run(model=model, passes=passes, threads=threads)
    result["provenance"] = provenance.collect(model=result["model"], threads=result["threads"])
    if out:
        atomic.write_json(out, result)
        print(f"wrote {out}")
    return 0
