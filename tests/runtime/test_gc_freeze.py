"""The import-time heap leaves the collector's walks at plugin load (runtime/gc_freeze.py),
and VLLM_EDGE_GC_FREEZE=0 leaves it to vLLM's own later freeze."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
