"""Which cores a measurement runs on, and pinning this process (and the engine
processes it starts) to them before vLLM is imported."""

from __future__ import annotations

import os
import sys
from typing import Sequence

from vllm_edge.common.errors import UsageError


def parse_int_list(text: str | None, what: str, minimum: int = 1) -> tuple[int, ...]:
    """``"1,4,8"`` -> ``(1, 4, 8)``; empty -> ``()``. Values must be at least ``minimum``
    (0 for core numbers)."""
    if text is None or text.strip() == "":
        return ()
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if any(v < minimum for v in vals):
        raise UsageError(f"{what}: values must be at least {minimum}, got {text!r}")
    return vals


def core_set(cpus: Sequence[int] | None, threads: int | None, allowed: Sequence[int]) -> list[int]:
    """The cores to pin to. vLLM's CPU worker binds one OpenMP thread per allowed
    core, so ``threads`` takes the first N cores of the set."""
    cores = sorted(set(cpus)) if cpus else sorted(allowed)
    missing = sorted(set(cores) - set(allowed))
    if missing:
        raise UsageError(f"--cpus {','.join(map(str, cores))}: cores {missing} are not in "
                         f"this process's affinity {sorted(allowed)}")
    if threads is not None:
        if threads > len(cores):
            raise UsageError(f"--threads {threads} exceeds the {len(cores)} cores in the set {cores}")
        cores = cores[:threads]
    return cores


def pin(cores: list[int]) -> dict:
    """Pin this process (and so the engine processes it starts) and set
    OMP_NUM_THREADS. Must run before vLLM is imported."""
    if "vllm" in sys.modules:
        raise RuntimeError("vllm already imported: pinning now would not reach its thread pools")
    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    rec = {"cores": cores, "threads": len(cores), "OMP_NUM_THREADS": str(len(cores))}
    if "torch" in sys.modules:
        # OpenMP read the variable when torch loaded; its pool is still unstarted, so resize it.
        import torch

        torch.set_num_threads(len(cores))
        rec["torch_imported_before_pin"] = True
    return rec
