"""`vllm-edge bandwidth`: the read bandwidth this core set can reach, the ceiling that
bytes-per-token figures are set against.

Streaming reductions (``sum`` over float64, ``amax`` over float32) over a buffer far
larger than the last-level cache, on torch's thread pool sized and pinned like
``bench speed`` (:func:`vllm_edge.common.pinning.core_set`, :func:`~vllm_edge.common.pinning.pin`). Each rep runs every kernel
once, kernels interleaved. The ceiling is the best pass of any kernel: on a shared host
contention only ever lowers a pass, so the best one is the closest to the hardware
(the median is reported beside it).

A buffer that fits a few times into the LLC would measure the cache, not memory: it is
refused unless ``--allow-in-cache``, and such a result is marked ``in_cache`` and never
used as a ceiling.

Each host has its own artifact (``benchmarks/results/bandwidth/<host>.json``), and a ceiling
is only ever set against runs on the host that measured it: another machine's bandwidth would
make a share of the ceiling that means nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from vllm_edge.common import stats
from vllm_edge.common.errors import EdgeError

DEFAULT_DIR = "benchmarks/results/bandwidth"
METRIC = "read_gb_per_s"
MIN_LLC_MULTIPLE = 8       # buffer / LLC below this measures the cache
DEFAULT_LLC_MULTIPLE = 16
MIN_BUFFER_MIB = 512
DEFAULT_REPS = 10
GB = 1e9                   # bandwidth in decimal GB/s, as vendors quote it


class BandwidthError(EdgeError, ValueError):
    """Bad arguments or an unusable bandwidth artifact."""


def default_out(cores: list[int]) -> str:
    """This host's artifact: one file per host, so a run never replaces another host's."""
    from vllm_edge.common import provenance

    return f"{DEFAULT_DIR}/{provenance.host_slug(provenance.this_host(cores))}.json"


def llc_bytes(cache_kib: dict[str, int]) -> int | None:
    """The largest cache level the probe found (the last level), in bytes."""
    sizes = [v for k, v in cache_kib.items() if k != "L1d"]
    return max(sizes) * 1024 if sizes else None


def default_buffer_bytes(llc: int | None) -> int:
    return max(MIN_BUFFER_MIB << 20, DEFAULT_LLC_MULTIPLE * (llc or 0))


def check_buffer(buffer_bytes: int, llc: int | None, allow_in_cache: bool) -> bool:
    """True when the buffer is large enough to measure memory rather than cache."""
    if buffer_bytes < 1 << 20:
        raise BandwidthError(f"--buffer-mib: at least 1 MiB, got {buffer_bytes} bytes")
    if llc is None:
        return True  # unknown LLC: the default buffer is 512 MiB, larger than any LLC we know
    big = buffer_bytes >= MIN_LLC_MULTIPLE * llc
    if not big and not allow_in_cache:
        raise BandwidthError(
            f"buffer of {buffer_bytes >> 20} MiB is under {MIN_LLC_MULTIPLE}x the last-level cache "
            f"({llc >> 20} MiB, from sysfs): it would measure the cache. Use at least "
            f"{MIN_LLC_MULTIPLE * llc >> 20} MiB, or --allow-in-cache for a test run")
    return big


def _kernels(buffer_bytes: int) -> tuple[dict[str, Callable[[], Any]], Any]:
    import torch

    n = buffer_bytes // 8
    buf = torch.ones(n, dtype=torch.float64)  # written once: every page is resident
    f32 = buf.view(torch.float32)
    return {"sum_f64": lambda: buf.sum(), "amax_f32": lambda: f32.amax()}, buf


def measure(buffer_bytes: int, reps: int = DEFAULT_REPS, warmup: int = 1) -> dict:
    """Run every kernel ``reps`` times (interleaved); GB/s per pass per kernel."""
    if reps < 1:
        raise BandwidthError("--reps must be at least 1")
    kernels, buf = _kernels(buffer_bytes)
    nbytes = buf.numel() * buf.element_size()
    for _ in range(warmup):
        for f in kernels.values():
            f()
    runs: dict[str, list[float]] = {k: [] for k in kernels}
    for _ in range(reps):
        for name, f in kernels.items():
            t0 = time.perf_counter()
            f()
            dt = time.perf_counter() - t0
            runs[name].append(nbytes / dt / GB)
    del buf
    return {"buffer_bytes": nbytes, "runs": runs}


def build_label(threads: int) -> str:
    return f"read bandwidth ({threads} thread{'s' if threads != 1 else ''})"


def run(buffer_bytes: int | None = None, reps: int = DEFAULT_REPS, pinning: dict | None = None,
        allow_in_cache: bool = False, out: str | os.PathLike | None = None) -> dict:
    import torch

    from vllm_edge.common import atomic, provenance
    from vllm_edge.common.hw import probe_cpu

    cpu = probe_cpu()
    llc = llc_bytes(cpu.cache_kib)
    buffer_bytes = buffer_bytes or default_buffer_bytes(llc)
    beyond_llc = check_buffer(buffer_bytes, llc, allow_in_cache)
    threads = torch.get_num_threads()
    measured = measure(buffer_bytes, reps)
    per_kernel = {k: stats.summarize(v, METRIC) for k, v in measured["runs"].items()}
    all_runs = [x for v in measured["runs"].values() for x in v]
    overall = stats.summarize(all_runs, METRIC)
    result = {
        "benchmark": "bandwidth",
        "build": build_label(threads),
        "threads": threads,
        "cores": (pinning or {}).get("cores") or sorted(os.sched_getaffinity(0)),
        "buffer_bytes": measured["buffer_bytes"],
        "llc_bytes": llc,
        "buffer_over_llc": round(measured["buffer_bytes"] / llc, 2) if llc else None,
        "in_cache": not beyond_llc,
        "kernels": {"sum_f64": "torch.sum over a float64 view", "amax_f32": "torch.amax over a float32 view"},
        "reps": reps,
        "metrics": {METRIC: overall, **{f"{k}_gb_per_s": s for k, s in per_kernel.items()}},
        "runs": measured["runs"],
        "ceiling_gb_per_s": None if not beyond_llc else overall["best"],
        "median_gb_per_s": overall["median"],
        "pinning": pinning,
        "provenance": provenance.collect(threads=threads,
                                         extra={"core_set_pinned": (pinning or {}).get("cores"),
                                                "cache_kib": cpu.cache_kib}),
    }
    return atomic.write_result(out, result)


# --- reading a result back (for bench speed) -----------------------------------------

def load_ceiling(path: str | os.PathLike, cores: list[int]) -> dict:
    """The ceiling from a bandwidth artifact, if it was measured on these cores.

    Raises :class:`BandwidthError` naming the file and the mismatch otherwise.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise BandwidthError(f"{p}: no bandwidth result (run `vllm-edge bandwidth` first)") from None
    except json.JSONDecodeError as exc:
        raise BandwidthError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("benchmark") != "bandwidth":
        raise BandwidthError(f"{p}: not a `vllm-edge bandwidth` result (field 'benchmark')")
    if data.get("in_cache") or not data.get("ceiling_gb_per_s"):
        raise BandwidthError(f"{p}: its buffer fit in the cache; it is not a memory ceiling")
    if sorted(data.get("cores") or []) != sorted(cores):
        raise BandwidthError(f"{p}: measured on cores {data.get('cores')}, this run uses {sorted(cores)}")
    from vllm_edge.common import provenance

    measured_on, here = provenance.host(data.get("provenance")), provenance.this_host(cores)
    if measured_on != here:
        raise BandwidthError(f"{p}: measured on {measured_on or 'an unrecorded host'}, this run is on {here}")
    return {"source": str(p), "ceiling_gb_per_s": data["ceiling_gb_per_s"],
            "median_gb_per_s": data.get("median_gb_per_s"), "threads": data.get("threads"),
            "cores": data.get("cores"), "buffer_bytes": data.get("buffer_bytes"),
            "timestamp": (data.get("provenance") or {}).get("timestamp"),
            "loadavg": (data.get("provenance") or {}).get("loadavg")}


def format_table(result: dict) -> str:
    rows = stats.summary_rows(result["metrics"], "kernel", 20, 8)
    llc = result["llc_bytes"]
    rows.append(f"buffer {result['buffer_bytes'] / 2**20:.0f} MiB"
                + (f" = {result['buffer_over_llc']}x LLC ({llc / 2**20:.0f} MiB)" if llc else " (LLC unknown)")
                + f" | {result['threads']} threads on cores {result['cores']}")
    rows.append("ceiling: " + (f"{result['ceiling_gb_per_s']:.2f} GB/s (best pass)"
                               if result["ceiling_gb_per_s"] else "none: the buffer fit in the cache"))
    return "\n".join(rows)
