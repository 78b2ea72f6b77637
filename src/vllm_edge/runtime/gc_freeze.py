"""Take the import-time heap out of the cyclic garbage collector's walks, once per process.

After ``import vllm`` a process tracks about 600,000 objects (modules, classes, functions)
that live as long as it does. On the way to ready vLLM runs a full ``gc.collect()`` several
times (after each model load, in the profile run, in its own heap freeze), and each walks
all of them to free nothing: about 0.25 s apiece on this 2-core host. vLLM already freezes
its heap with ``gc.freeze()``, but only once the engine is up (``freeze_gc_heap``). Freezing
at plugin load, before the model is built, does the same earlier, so those collections walk
only what came after. Frozen objects are still freed by reference counting; only a cycle
among them would outlive its use, and the young generations are collected first.

Before that freeze, a server process spends most of its warm start importing torch, vLLM and
vLLM's API server, and the collector's default thresholds (700 allocations for a young
collection) make it walk the growing import heap again and again. :func:`hold_for_start`
raises them while a server starts and :func:`end_start` puts the process's own back once its
engine is ready; a young collection still runs every ``START_THRESHOLD[0]`` allocations, so
garbage made during the start is still freed.
"""

from __future__ import annotations

import gc

# gen0 allocations, then young collections per gen1, then gen1 per full collection
START_THRESHOLD = (50_000, 20, 20)
_held: tuple[int, int, int] | None = None


def apply() -> str:
    """Freeze what this process tracks now; the state string says what happened."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_GC_FREEZE"):
        return "off"
    gc.collect(1)  # the young generations: cheap, and whatever garbage the imports left
    before = gc.get_freeze_count()
    gc.freeze()
    return f"froze {gc.get_freeze_count() - before} objects"


def hold_for_start() -> str:
    """Collect less often until :func:`end_start`; the state string says what happened."""
    from vllm_edge import envs

    global _held
    if not envs.get("VLLM_EDGE_GC_START"):
        return "off"
    if _held is None:
        _held = gc.get_threshold()
        gc.set_threshold(*START_THRESHOLD)
    return f"thresholds {START_THRESHOLD} while starting (Python's: {_held})"


def end_start() -> None:
    """The thresholds the process had before :func:`hold_for_start` (nothing if not held)."""
    global _held
    if _held is not None:
        gc.set_threshold(*_held)
        _held = None
