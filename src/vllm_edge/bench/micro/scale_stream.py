"""`vllm-edge bench scale-prefetch`: the decode product over a whole model's linears, with the
scales prefetched some groups ahead and not at all, paired in one process.

A single layer timed in a loop sits in the cache, and the scales' stride never matters there.
Decode streams every layer once a step, so this bench lays out a model's worth of layers of
the shapes named (random codes and scales: the time does not depend on their values), puts
them in huge pages as the engine does, and times one row through all of them: the bytes cross
memory as they do in a decode step, without the rest of the engine around them. Distances run
back to back in every round, the order rotated, and each round's time is set against the same
round's no-prefetch time: the host's bandwidth, which on a shared machine moves by tens of
percent within minutes, moves both sides of every ratio together. Each activation route the CPU
has (bf16 and, with AVX512-VNNI, int8) is measured.

The engine's end-to-end effect is for `grid` (benchmarks/specs/scale_prefetch.json); this one
isolates the product, so that a verdict does not hang on a host that moved between two runs.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from vllm_edge.common import stats
from vllm_edge.common.errors import EdgeError

# (rows N, columns K) of every linear of one layer, and the layer count; the head is left out
SETS = {
    "smollm2-135m": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], 30),
    "llama-1b": ([(3072, 2048), (2048, 2048), (11264, 2048), (2048, 5632)], 16),
}
DEFAULT_AHEAD = (0, 2, 4)
GROUP = 32


class ScaleStreamError(EdgeError, ValueError):
    """Bad arguments, or no native product on this CPU."""


def _layers(shapes: list[tuple[int, int]], layers: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        for n, k in shapes:
            packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
            sz = (torch.randn(k // GROUP, n, 2, generator=g) * 0.01).to(torch.bfloat16).contiguous()
            out.append((n, k, packed, sz))
    return out


def run(sets: tuple[str, ...] = tuple(SETS), ahead: tuple[int, ...] = DEFAULT_AHEAD,
        rounds: int = 30, threads: int = 2, layers: int | None = None,
        log: Callable[[str], None] = print) -> dict:
    import torch

    from vllm_edge.quant import native
    from vllm_edge.runtime import huge_pages

    if 0 not in ahead:
        raise ScaleStreamError("--ahead must include 0 (no prefetch), the side every ratio is set against")
    if rounds < 3:
        raise ScaleStreamError("--rounds must be at least 3")
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise ScaleStreamError(f"unknown shape set(s) {unknown}; choose from {sorted(SETS)}")
    lib = native.library()
    if lib is None or not native.gemv_supported():
        raise ScaleStreamError("no AVX512-BF16 int4 product here (native.gemv_supported() is false); "
                               "the AVX2 product is not timed by this bench")
    torch.set_num_threads(threads)
    gemv = lib.edge_int4_gemv
    routes = [False] + ([True] if native.set_act8(lib, True) else [])
    results = []
    try:
        for name in sets:
            shapes, n_layers = SETS[name]
            weights = _layers(shapes, layers or n_layers)
            holder = torch.nn.Module()
            for i, (_, _, p, sz) in enumerate(weights):
                holder.register_buffer(f"p{i}", p)
                holder.register_buffer(f"s{i}", sz)
            pages = huge_pages.collapse_ranges(huge_pages.weight_ranges(holder))
            xs = {k: torch.randn(1, k).to(torch.bfloat16) for _, k in shapes}
            ys = {n: torch.empty(1, n, dtype=torch.bfloat16) for n, _ in shapes}
            nbytes = sum(p.numel() + sz.numel() * sz.element_size() for _, _, p, sz in weights)

            def step() -> float:
                t = time.perf_counter()
                for n, k, p, sz in weights:
                    if gemv(p.data_ptr(), sz.data_ptr(), xs[k].data_ptr(), ys[n].data_ptr(),
                            1, n, k, GROUP, threads) != 0:
                        raise ScaleStreamError(f"the product refused a {n}x{k} layer")
                return time.perf_counter() - t

            for act8 in routes:
                native.set_act8(lib, act8)
                times: dict[int, list[float]] = {a: [] for a in ahead}
                order = list(ahead)
                for r in range(rounds):
                    for a in order[r % len(order):] + order[:r % len(order)]:
                        native.set_prefetch(lib, "edge_int4", a)
                        step()  # the first pass after a switch warms the branch, not the cache
                        times[a].append(step())
                row = {"set": name, "layers": len(weights), "bytes": nbytes,
                       "activations": "int8" if act8 else "bf16", "huge_pages": pages.to_dict(),
                       "gb_per_s": {str(a): stats.summarize([nbytes / t / 1e9 for t in v], "gb_per_s")
                                    for a, v in times.items()},
                       "speedup_vs_0": {}}
                for a in ahead:
                    if a == 0:
                        continue
                    paired = sorted(b / x for b, x in zip(times[0], times[a]))
                    q = len(paired) // 4
                    row["speedup_vs_0"][str(a)] = {"median": round(stats.summarize(paired, "x")["median"], 4),
                                                  "q1": round(paired[q], 4), "q3": round(paired[-1 - q], 4),
                                                  "rounds_faster": sum(v > 1 for v in paired),
                                                  "rounds": len(paired)}
                results.append(row)
                log(f"{name:<13} {row['activations']:<4} " + "  ".join(
                    f"ahead {a}: {row['gb_per_s'][str(a)]['median']:.1f} GB/s"
                    + (f" (x{row['speedup_vs_0'][str(a)]['median']:.3f}, faster in "
                       f"{row['speedup_vs_0'][str(a)]['rounds_faster']}/{rounds})" if a else "")
                    for a in ahead))
            del weights, holder
    finally:
        native.set_act8(lib)
        native.set_prefetch(lib, "edge_int4")
    return {"benchmark": "scale_prefetch_micro", "build": "cpu_int4 product, one row, whole-model stream",
            "group": GROUP, "threads": threads, "rounds": rounds, "ahead": list(ahead),
            "results": results}


def main(sets: tuple[str, ...], ahead: tuple[int, ...], rounds: int, threads: int | None,
         out: str | None) -> int:
    from vllm_edge.common import atomic, pinning, provenance

    cores = pinning.core_set(None, threads, sorted(os.sched_getaffinity(0)))
    pinned = pinning.pin(cores)
    result = run(sets, ahead, rounds, len(cores))
    result["pinning"] = pinned
    result["provenance"] = provenance.collect(threads=len(cores))
    if out:
        atomic.write_json(out, result)
        print(f"wrote {out}")
    return 0
