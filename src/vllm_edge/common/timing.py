"""Per-call timing of a small callable, shared by the microbenchmarks."""

from __future__ import annotations

import time
from typing import Callable


def per_call_us(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(wall, process CPU) microseconds per call over ``reps`` back-to-back calls.
    CPU time is less hurt by descheduling on a shared machine; wall time is what
    a user sees."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6, (time.process_time() - c0) / reps * 1e6
