"""`vllm-edge bench plugin-import`: what our plugin adds to vLLM's start-up.

Each sample is a fresh interpreter that imports vLLM the way a user does
(``from vllm import LLM``), then runs vLLM's own ``load_general_plugins()``.
The "without" arm sets ``VLLM_PLUGINS`` to a name that matches nothing, so
vLLM skips our entry point; everything else is identical. Arms alternate
every rep; we report medians and the median difference.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from vllm_edge.common import atomic, provenance

_PROBE = r"""
import json, os, time
from vllm_edge.common.procmem import rss_anon_kb
t0 = time.perf_counter()
from vllm import LLM
t1 = time.perf_counter()
r0 = rss_anon_kb(os.getpid())
from vllm.plugins import load_general_plugins
t2 = time.perf_counter()
load_general_plugins()
t3 = time.perf_counter()
r1 = rss_anon_kb(os.getpid())
print(json.dumps({"import_vllm_s": t1 - t0, "plugins_s": t3 - t2,
                  "rss_anon_after_import_mb": r0 / 1024, "rss_anon_after_plugins_mb": r1 / 1024}))
"""


def _sample(with_plugin: bool) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)
    if not with_plugin:
        env["VLLM_PLUGINS"] = "__no_such_plugin__"
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"probe failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(reps: int = 5, out: str | None = None) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {"with_plugin": [], "without_plugin": []}
    for i in range(reps):
        order = (True, False) if i % 2 == 0 else (False, True)
        for with_plugin in order:
            samples["with_plugin" if with_plugin else "without_plugin"].append(_sample(with_plugin))

    def med(arm: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[arm])

    summary = {
        "reps": reps,
        "plugins_s_with": round(med("with_plugin", "plugins_s"), 4),
        "plugins_s_without": round(med("without_plugin", "plugins_s"), 4),
        "import_vllm_s_median": round(med("without_plugin", "import_vllm_s"), 3),
        "rss_added_by_plugins_mb_with": round(
            med("with_plugin", "rss_anon_after_plugins_mb") - med("with_plugin", "rss_anon_after_import_mb"), 2),
        "rss_added_by_plugins_mb_without": round(
            med("without_plugin", "rss_anon_after_plugins_mb") - med("without_plugin", "rss_anon_after_import_mb"), 2),
    }
    summary["plugin_adds_s"] = round(summary["plugins_s_with"] - summary["plugins_s_without"], 4)
    summary["plugin_adds_fraction_of_import"] = round(summary["plugin_adds_s"] / summary["import_vllm_s_median"], 4)
    summary["plugin_adds_rss_mb"] = round(
        summary["rss_added_by_plugins_mb_with"] - summary["rss_added_by_plugins_mb_without"], 2)
    result = {"benchmark": "plugin-import", "summary": summary, "samples": samples,
              "provenance": provenance.collect()}
    if out:
        atomic.write_json(out, result)
    return result
