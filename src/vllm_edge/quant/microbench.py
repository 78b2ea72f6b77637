"""Batch-1 (and batch-M) timing of the cpu_int4 op against a bf16 linear, interleaved.

``python -m vllm_edge.quant.microbench`` writes benchmarks/results/cpu_int4_microbench.json.
Arms alternate inside every pass so load swings hit both; medians and ratios are reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vllm_edge.quant import ops, pack

SHAPES = {"gate_up 1536x576": (1536, 576), "down 576x1536": (576, 1536),
          "head 49152x576": (49152, 576), "4096x4096": (4096, 4096)}
# The VLM's SigLIP-shaped vision tower (models/vlm.py): a 512-pixel tile is 1024 patch
# rows, so image prefill runs these linears at 1024 rows (docs/multimodal.md).
VISION_SHAPES = {"vision qkv/out 768x768": (768, 768), "vision fc1 3072x768": (3072, 768),
                 "vision fc2 768x3072": (768, 3072)}
SETS = {"lm": (SHAPES, (1, 4, 8, 64, 512)), "vision": (VISION_SHAPES, (1024,))}


def _time(fn, reps: int) -> tuple[float, float]:
    """(wall, process CPU) microseconds per call; CPU time is less hurt by descheduling
    on a shared machine, wall time is what a user sees."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6, (time.process_time() - c0) / reps * 1e6


def run(rows=(1, 4, 8, 64, 512), passes: int = 7, group: int = 128, threads: int = 2,
        shapes: dict | None = None) -> dict:
    torch.set_num_threads(threads)
    ops.register()
    results = []
    for label, (n, k) in (shapes or SHAPES).items():
        w = torch.randn(n, k) * 0.05
        q, s, z = pack.quantize(w, group)
        p = pack.pack_nibbles(q)
        kg = pack.kernel_group(k, group)
        sz = pack.scales_and_zeros(s, z, group, k, kg)
        pack.repack_(p)
        wb = pack.dequantize_packed(p, sz, kg).contiguous()
        for m in rows:
            if m > 8 and n > 16384:
                continue  # the head only sees one row per sequence
            x = torch.randn(m, k, dtype=torch.bfloat16)
            arms = {
                "int4_op": lambda: ops.int4_linear(x, p, sz, kg, ops.DEFAULT_DEQUANT_THRESHOLD),
                "tinygemm": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, kg, sz),
                "dequant_gemm": lambda: ops.int4_linear(x, p, sz, kg, 0),
                "bf16": lambda: torch.nn.functional.linear(x, wb),
            }
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
            print(f"{label:>18} rows={m:<4} " + " ".join(f"{a}={v:9.1f}us" for a, v in med.items())
                  + f"  bf16/int4={results[-1]['bf16_over_int4_op']} (cpu {results[-1]['bf16_over_int4_op_cpu']})",
                  flush=True)
    return {"passes": passes, "threads": threads, "dequant_threshold": ops.DEFAULT_DEQUANT_THRESHOLD,
            "results": results}


def main() -> None:
    from vllm_edge import atomic
    from vllm_edge.harness import provenance

    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", choices=sorted(SETS), default="lm",
                    help="lm: SmolLM2 and 4096 shapes at 1-512 rows; vision: the VLM's vision "
                         "tower at 1024 rows (one image tile)")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--out", default=None,
                    help="default: benchmarks/results/cpu_int4_microbench.json (lm) or "
                         "cpu_int4_microbench_vision.json")
    a = ap.parse_args()
    shapes, rows = SETS[a.set]
    out = a.out or ("benchmarks/results/cpu_int4_microbench.json" if a.set == "lm"
                    else "benchmarks/results/cpu_int4_microbench_vision.json")
    res = run(rows=rows, passes=a.passes, threads=a.threads, group=a.group, shapes=shapes)
    res["set"] = a.set
    res["provenance"] = provenance.collect(threads=a.threads, extra={"torch": torch.__version__})
    atomic.write_json(out, res)


if __name__ == "__main__":
    main()
