"""Batch-1 (and batch-M) timing of the cpu_int4 op against a bf16 linear, interleaved.

Arms: ``int4_op`` (the op as configured by the quantizer, ``dequant_threshold: "auto"``),
its routes alone (``native_product``, ``tinygemm``, ``dequant_gemm``), ``bf16`` (an
unpacked ``F.linear``) and ``bf16_onednn`` (vLLM's prepacked oneDNN linear, what its bf16
CPU path runs).

``vllm-edge bench int4-micro`` writes benchmarks/results/cpu_int4_microbench.json.
Arms alternate inside every pass so load swings hit both; medians and ratios are reported,
of wall time and of process CPU time (less hurt by descheduling on a shared host).
``--profile`` adds a torch.profiler breakdown of the multi-row route at the largest row
count: the native dequantization (``edge_int4_dequant``) against the GEMM and the rest.
"""

from __future__ import annotations

import statistics

import torch

from vllm_edge.common.timing import per_call_us as _time
from vllm_edge.quant import native, ops, pack
from vllm_edge.quant.groups import DEFAULT_GROUP

SHAPES = {"gate_up 1536x576": (1536, 576), "down 576x1536": (576, 1536),
          "head 49152x576": (49152, 576), "4096x4096": (4096, 4096),
          # the issue's ~1B target (hidden 2048, MLP 5632, 8 KV heads of 64): merged layers
          "1b qkv 3072x2048": (3072, 2048), "1b gate_up 11264x2048": (11264, 2048),
          "1b down 2048x5632": (2048, 5632)}
# The VLM's SigLIP-shaped vision tower (models/vlm.py): a 512-pixel tile is 1024 patch
# rows, so image prefill runs these linears at 1024 rows (docs/guide/multimodal.md).
VISION_SHAPES = {"vision qkv/out 768x768": (768, 768), "vision fc1 3072x768": (3072, 768),
                 "vision fc2 768x3072": (768, 3072)}
SETS = {"lm": (SHAPES, (1, 4, 8, 64, 512)), "vision": (VISION_SHAPES, (1024,))}


def profile_multi_row(p, sz, kg, x, reps: int = 5) -> dict:
    """Where the multi-row route's time goes: torch.profiler self time per op (wall), and
    the process CPU time of the dequantization and of the GEMM run alone (medians; CPU time
    survives descheduling on a shared host better than wall time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            ops.int4_linear(x, p, sz, kg, 0)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    out = {"profiler_self_ms": {e.key: round(e.self_cpu_time_total / reps / 1e3, 2) for e in rows[:8]}}
    w = native.dequantize(p, sz, kg)
    if w is not None:
        parts = {"dequant": lambda: native.dequantize(p, sz, kg, out=w),
                 "gemm": lambda: torch.nn.functional.linear(x, w),
                 "op": lambda: ops.int4_linear(x, p, sz, kg, 0)}
        cpu = {a: [] for a in parts}
        for i in range(reps):
            for a, fn in parts.items():
                cpu[a].append(_time(fn, 1)[1] / 1e3)
        out["cpu_ms"] = {a: round(statistics.median(v), 2) for a, v in cpu.items()}
    return out


def _onednn(w: torch.Tensor):
    """vLLM's prepacked bf16 linear for ``w`` [N, K], or None where vLLM's _C lacks it."""
    try:
        from vllm import _custom_ops as vops

        handler = vops.create_onednn_mm(w.t(), 32)
    except (ImportError, AttributeError, RuntimeError):
        return None
    return lambda x: vops.onednn_mm(handler, x, None)


def run(rows=(1, 4, 8, 64, 512), passes: int = 7, group: int = 128, threads: int = 2,
        shapes: list[str] | None = None, profile: bool = False,
        table: dict | None = None) -> dict:
    torch.set_num_threads(threads)
    ops.register()
    results = []
    for label, (n, k) in (table or SHAPES).items():
        if shapes and not any(s in label for s in shapes):
            continue
        w = torch.randn(n, k) * 0.05
        q, s, z = pack.quantize(w, group)
        p = pack.pack_nibbles(q)
        kg = pack.kernel_group(k, group)
        sz = pack.scales_and_zeros(s, z, group, k, kg)
        pack.repack_(p)
        wb = pack.dequantize_packed(p, sz, kg).contiguous()
        onednn = _onednn(wb)
        for m in rows:
            if m > 8 and n > 16384:
                continue  # the head only sees one row per sequence
            x = torch.randn(m, k, dtype=torch.bfloat16)
            arms = {
                "int4_op": lambda: ops.int4_linear(x, p, sz, kg, ops.AUTO),
                "tinygemm": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, kg, sz),
                "dequant_gemm": lambda: ops.int4_linear(x, p, sz, kg, 0),
                "bf16": lambda: torch.nn.functional.linear(x, wb),
            }
            if native.gemv(x, p, sz, kg) is not None:
                arms["native_product"] = lambda: native.gemv(x, p, sz, kg)
            if onednn is not None:
                arms["bf16_onednn"] = lambda: onednn(x)
            reps = max(1, min(50, int(2e9 / (n * k * m))))
            samples: dict[str, list[float]] = {a: [] for a in arms}
            cpu: dict[str, list[float]] = {a: [] for a in arms}
            for fn in arms.values():
                fn()
            for i in range(passes):
                order = list(arms)[i % len(arms):] + list(arms)[:i % len(arms)]
                for a in order:
                    wall, c = _time(arms[a], reps)
                    samples[a].append(wall)
                    cpu[a].append(c)
            med = {a: statistics.median(v) for a, v in samples.items()}
            results.append({
                "shape": label, "n": n, "k": k, "rows": m, "group": group, "kernel_group": kg,
                "median_us": {a: round(v, 1) for a, v in med.items()},
                "best_us": {a: round(min(v), 1) for a, v in samples.items()},
                "spread_us": {a: round(max(v) - min(v), 1) for a, v in samples.items()},
                "median_cpu_us": {a: round(statistics.median(v), 1) for a, v in cpu.items()},
                "bf16_over_int4_op": round(med["bf16"] / med["int4_op"], 2),
                "bf16_over_int4_op_cpu": round(statistics.median(cpu["bf16"]) / statistics.median(cpu["int4_op"]), 2),
            })
            if "bf16_onednn" in med:
                results[-1]["bf16_onednn_over_int4_op"] = round(med["bf16_onednn"] / med["int4_op"], 2)
            if profile and m == max(rows) and m > ops.DEFAULT_DEQUANT_THRESHOLD:
                results[-1]["profile_multi_row"] = profile_multi_row(p, sz, kg, x)
                print(f"{'':>18} profile: {results[-1]['profile_multi_row']}", flush=True)
            print(f"{label:>18} rows={m:<4} " + " ".join(f"{a}={v:9.1f}us" for a, v in med.items())
                  + f"  bf16/int4={results[-1]['bf16_over_int4_op']} (cpu {results[-1]['bf16_over_int4_op_cpu']})",
                  flush=True)
    return {"passes": passes, "threads": threads, "dequant_threshold": ops.auto_threshold(),
            "native_product": native.gemv_supported(), "native_product_32row": native.gemv32_supported(),
            "workspace_mb": ops.DEFAULT_WORKSPACE_MB, "native_dequant": native.library() is not None,
            "results": results}


def default_out(set_name: str) -> str:
    return ("benchmarks/results/cpu_int4_microbench.json" if set_name == "lm"
            else "benchmarks/results/cpu_int4_microbench_vision.json")


def main(set_name: str = "lm", rows: tuple[int, ...] | None = None, passes: int = 7,
         group: int = DEFAULT_GROUP, threads: int = 2, shapes: list[str] | None = None,
         profile: bool = False, out: str | None = None) -> dict:
    """Run one set and write its result (with provenance) to ``out`` or the set's default."""
    from vllm_edge.common import atomic, provenance

    from vllm_edge.bench.compare import refuse_other_hosts_file

    out = out or default_out(set_name)
    refuse_other_hosts_file(out)
    table, set_rows = SETS[set_name]
    res = run(rows=rows or set_rows, passes=passes, group=group, threads=threads, shapes=shapes,
              profile=profile, table=table)
    res["set"] = set_name
    res["provenance"] = provenance.collect(threads=threads, extra={"torch": torch.__version__})
    atomic.write_json(out, res)
    return res
