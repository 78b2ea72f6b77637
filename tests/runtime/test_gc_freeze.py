"""The import-time heap leaves the collector's walks at plugin load (runtime/gc_freeze.py),
and VLLM_EDGE_GC_FREEZE=0 leaves it to vLLM's own later freeze; a starting server collects
less often until its engine is ready, and VLLM_EDGE_GC_START=0 keeps Python's thresholds."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest

from vllm_edge.runtime import gc_freeze

PROBE = """
import gc, json
import vllm
from vllm_edge.runtime import gc_freeze
tracked = len(gc.get_objects())
state = gc_freeze.apply()
print(json.dumps({"state": state, "frozen": gc.get_freeze_count(), "tracked": tracked,
                  "left": len(gc.get_objects())}))
"""


def probe(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", ["1", "0"])
def test_the_import_heap_is_frozen_unless_switched_off(value):
    r = probe({"VLLM_EDGE_GC_FREEZE": value})
    if value == "0":
        assert r["state"] == "off" and r["frozen"] == 0 and r["left"] >= r["tracked"] - 1000
    else:
        # nearly everything vLLM's import created is out of the collector's reach now
        assert r["state"] == f"froze {r['frozen']} objects"
        assert r["frozen"] > 0.9 * r["tracked"] > 100_000
        assert r["left"] < 1000


def test_start_thresholds_are_held_then_given_back(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setenv("VLLM_EDGE_GC_START", "1")
    try:
        state = gc_freeze.hold_for_start()
        assert gc.get_threshold() == gc_freeze.START_THRESHOLD != before
        assert str(before) in state
        gc_freeze.hold_for_start()  # a second hold keeps the thresholds the first one saved
    finally:
        gc_freeze.end_start()
    assert gc.get_threshold() == before
    gc_freeze.end_start()  # nothing held: nothing changes
    assert gc.get_threshold() == before


def test_start_thresholds_switched_off(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setenv("VLLM_EDGE_GC_START", "0")
    assert gc_freeze.hold_for_start() == "off"
    assert gc.get_threshold() == before
