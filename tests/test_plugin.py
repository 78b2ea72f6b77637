"""The plugin entry point, as vLLM discovers and calls it."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

from vllm_edge import envs


def test_entry_point_is_registered():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("edge") == "vllm_edge.plugin:register"


def _in_fresh_interpreter(code: str, env: dict | None = None) -> dict:
    import os

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_loads_the_plugin_and_it_is_reentrant():
    out = _in_fresh_interpreter(
        "import json\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm_edge import plugin, patches\n"
        "first = plugin.process_report()\n"
        "import vllm.compilation.decorators as d\n"
        "fn = d._try_load_aot_compiled_fn\n"
        "plugin.register(); plugin.register()\n"
        "second = plugin.process_report()\n"
        "print(json.dumps({'first': first['patches'], 'second': second['patches'],"
        " 'same_fn': fn is d._try_load_aot_compiled_fn, 'registered': second['registered']}))\n"
    )
    # off unless switched on (the child inherits this environment): the shipped default
    greedy = "applied" if envs.get("VLLM_EDGE_PATCH_GREEDY_SAMPLER") else "disabled"
    assert out["first"] == {"aot_cache": "applied", "kv_budget": "applied", "arena_release": "applied",
                            "weight_huge_pages": "applied", "hermes_json_end": "applied", "amx_attention": "applied",
                            "greedy_sampler": greedy, "slot_mapping_bind": "applied",
                            "pp_stage_buffer": "applied", "wna16_missing_op": "applied",
                            "gemma2_embedding_quant": "applied",
                            "tokenizer_build_lists": "applied",
                            "tokenizer_copies": "applied",
                            "processor_template_probe": "applied",
                            "kernel_rebind_scan": "applied"}
    assert out["second"] == out["first"]
    assert out["same_fn"] and out["registered"]


def test_vllm_plugins_filter_leaves_vllm_untouched():
    out = _in_fresh_interpreter(
        "import json\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "import vllm.compilation.decorators as d\n"
        "print(json.dumps({'patched': hasattr(d._try_load_aot_compiled_fn, '__vllm_edge_patch__')}))\n",
        env={"VLLM_PLUGINS": "__none__"},
    )
    assert out["patched"] is False
