"""Take the import-time heap out of the cyclic garbage collector's walks, once per process.

After ``import vllm`` a process tracks about 600,000 objects (modules, classes, functions)
that live as long as it does. On the way to ready vLLM runs a full ``gc.collect()`` several
times (after each model load, in the profile run, in its own heap freeze), and each walks
all of them to free nothing: about 0.25 s apiece on this 2-core host. vLLM already freezes
its heap with ``gc.freeze()``, but only once the engine is up (``freeze_gc_heap``). Freezing
at plugin load, before the model is built, does the same earlier, so those collections walk
only what came after. Frozen objects are still freed by reference counting; only a cycle
among them would outlive its use, and the young generations are collected first.
"""

from __future__ import annotations

import gc


def apply() -> str:
    """Freeze what this process tracks now; the state string says what happened."""
    from vllm_edge import envs

    if not envs.get("VLLM_EDGE_GC_FREEZE"):
        return "off"
    gc.collect(1)  # the young generations: cheap, and whatever garbage the imports left
    before = gc.get_freeze_count()
    gc.freeze()
    return f"froze {gc.get_freeze_count() - before} objects"
