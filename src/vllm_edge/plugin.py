"""The only entry point vLLM calls (``vllm.general_plugins``).

vLLM calls :func:`register` in every process it starts: the API server, the
engine core and each worker. It must be cheap, re-entrant and idempotent:
patches are applied once per process and their states never change after.
"""

from __future__ import annotations

import logging
import os
import threading

from vllm_edge.common.registration import Registration

_lock = threading.Lock()
_registered_pid: int | None = None
_registrations: list[Registration] = []
_isa_probe: str | None = None
_gc_freeze: str | None = None


def _setup_logging() -> None:
    from vllm_edge import envs

    log = logging.getLogger("vllm_edge")
    if log.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [vllm-edge pid=%(process)d] %(message)s", "%m-%d %H:%M:%S")
    )
    log.addHandler(handler)
    log.setLevel(str(envs.get("VLLM_EDGE_LOG_LEVEL")).upper())
    log.propagate = False


def register() -> None:
    global _registered_pid
    with _lock:
        if _registered_pid == os.getpid():
            return
        _setup_logging()
        from vllm_edge import patches

        loaded = patches.load_all()
        from vllm_edge import attention, kernels, models, quant
        from vllm_edge.common import timeline

        timeline.install()  # measurement only: nothing unless VLLM_EDGE_TIMELINE is set
        from vllm_edge.runtime import isa_probe

        global _isa_probe
        try:
            _isa_probe = isa_probe.apply()
        except Exception as exc:  # a startup shortcut must never stop vLLM from starting
            _isa_probe = f"error: {exc}"

        for reg in [*quant.register(), *kernels.register(), *attention.register(), *models.register()]:
            if reg not in _registrations:
                _registrations.append(reg)
        from vllm_edge.runtime import gc_freeze, speculative_gate

        speculative_gate.apply()

        global _gc_freeze
        _gc_freeze = gc_freeze.apply()  # last: everything the plugin imported is frozen too
        _registered_pid = os.getpid()
    logging.getLogger("vllm_edge").info(
        "plugin loaded: patches %s",
        ", ".join(f"{p.name}={p.state.value}" for p in loaded),
    )


def registrations() -> list[Registration]:
    return list(_registrations)


def _ir_priority() -> dict[str, list[str]] | None:
    """The IR dispatch priority vLLM installed in this process (set at worker init)."""
    try:
        from vllm.ir.op import IrOp
    except ImportError:
        return None
    return {name: op.get_priority() for name, op in sorted(IrOp.registry.items())}


def process_report() -> dict:
    """What the plugin did in this process; workers return it over collective_rpc."""
    import gc

    from vllm_edge import patches
    from vllm_edge.patches import aot_cache, greedy_sampler, slot_mapping_bind
    from vllm_edge.runtime import huge_pages, memory, speculative_gate

    report = {
        "pid": os.getpid(),
        "registered": _registered_pid == os.getpid(),
        "patches": patches.states(),
        "aot_noop_attached": list(aot_cache.attached),
        "arena_releases": [r.to_dict() for r in memory.history],
        "weight_huge_pages": [r.to_dict() for r in huge_pages.history],
        # which route each step took; the per-step patches are otherwise invisible
        "greedy_sampler_steps": {"fast": greedy_sampler.fast_steps,
                                 "original": greedy_sampler.fallback_steps},
        "slot_mapping_fast_calls": slot_mapping_bind.fast_calls,
        # vLLM's engine core freezes its start-up heap (freeze_gc_heap); 0 would mean it stopped
        "gc_frozen_objects": gc.get_freeze_count(),
        "registrations": [r.name for r in _registrations],
        "registration_states": {r.name: r.state for r in _registrations},
        "ir_priority": _ir_priority(),
        "isa_probe": _isa_probe,
        "gc_freeze": _gc_freeze,
        "speculative_gate": speculative_gate.report(),
    }
    try:  # proves "compiled nothing" vs "loaded the cached artifact"
        from dataclasses import asdict

        from vllm.compilation.counter import compilation_counter

        report["compilation_counter"] = asdict(compilation_counter)
    except ImportError:
        report["compilation_counter"] = None
    return report
