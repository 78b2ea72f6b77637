"""On the real engine (one process each): with VLLM_EDGE_FUSED_KV_ATTENTION on, every
attention layer runs our backend, ``unified_kv_cache_update`` never runs, and greedy tokens
equal vLLM's own backend; the compiled graph traces with it, and the compile cache keeps
the two states apart.

Four engine starts: SmolLM2 eager with the switch on and off, then a 2-layer synthetic
model compiled with it on and off in one fresh compile cache (12.5 min on a shared 2-core host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.hosts import amx_host

pytestmark = pytest.mark.slow
PROBE = Path(__file__).parents[1] / "support" / "fused_attention_engine_probe.py"
SWITCH = "VLLM_EDGE_FUSED_KV_ATTENTION"
UPDATE, ATTN = "vllm::unified_kv_cache_update", "vllm::unified_attention_with_output"
WRITE, KERNEL = "_C::cpu_attn_reshape_and_cache", "_C::cpu_attention_with_kv_cache"


def _probe(model_dir: Path, mode: str, switch: str, **env: str) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", SWITCH: switch, **env}
    proc = subprocess.run([sys.executable, str(PROBE), str(model_dir), mode], capture_output=True,
                          text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def eager(default_model_dir):
    return {"on": _probe(default_model_dir, "eager", "1"), "off": _probe(default_model_dir, "eager", "0")}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, default_model_dir):
    from vllm_edge.models import synthetic

    root = tmp_path_factory.mktemp("fused-attn")
    model = synthetic.build(root / "tiny", synthetic.Shape.derive(256, 2, 49152),
                            tokenizer_from=default_model_dir, progress=False)
    cache = {"VLLM_CACHE_ROOT": str(root / "vllm-cache")}  # fresh: both states compile here
    return {"on": _probe(model, "compiled", "1", **cache), "off": _probe(model, "compiled", "0", **cache)}


def test_switch_on_every_attention_layer_runs_the_fused_backend(eager):
    r = eager["on"]
    assert r["worker"]["registration_states"]["fused_kv_attention"] == "registered"
    assert len(r["layers"]) == 30
    for layer in r["layers"]:
        assert layer["backend"] == "FusedKVCPUAttentionBackend" and layer["impl"] == "FusedKVCPUAttentionImpl"
        assert layer["includes_update"] and layer["views_of_bound_cache"]


def test_switch_on_never_calls_the_separate_update_op(eager):
    calls, layers = eager["on"]["op_calls"], len(eager["on"]["layers"])
    assert calls[UPDATE] == 0
    # one op per layer and forward, and it still writes the cache once per layer and forward
    assert calls[ATTN] == calls[WRITE] == calls[KERNEL] > 0
    assert calls[ATTN] % layers == 0 and calls[ATTN] // layers >= 24


def test_switch_off_is_vllms_backend_with_its_two_ops(eager):
    r = eager["off"]
    assert r["worker"]["registration_states"]["fused_kv_attention"] == f"skipped: {SWITCH}=0"
    assert {(x["backend"], x["impl"], x["includes_update"]) for x in r["layers"]} == {
        ("CPUAttentionBackend", "CPUAttentionBackendImpl", False)}
    calls = r["op_calls"]
    assert calls[UPDATE] == calls[ATTN] == calls[WRITE] == eager["on"]["op_calls"][ATTN]


def test_greedy_tokens_equal_vllms_backend(eager):
    on, off = eager["on"], eager["off"]
    assert [len(t) for t in on["tokens"]] == [24] * 4
    assert on["tokens"] == off["tokens"]
    # the last prompt reads a block the first batch wrote: the cache holds the same bytes
    assert on["cached_prompt_tokens"][-1] >= 128 and off["cached_prompt_tokens"][-1] >= 128
    assert "Paris" in on["text"][0]


def test_the_amx_patch_still_decides_the_kernel(eager):
    on, off = eager["on"], eager["off"]
    assert {x["isa"] for x in on["layers"]} == {x["isa"] for x in off["layers"]}
    if amx_host():
        assert on["worker"]["patches"]["amx_attention"] == "applied"
        assert {x["isa"] for x in on["layers"]} == {"vec"}


def test_compiled_graph_traces_with_one_attention_op_per_layer(compiled):
    on = compiled["on"]
    assert on["worker"]["compilation_counter"]["num_aot_compiles"] == 1
    assert {x["backend"] for x in on["layers"]} == {"FusedKVCPUAttentionBackend"}
    calls = on["op_calls"]
    assert calls[UPDATE] == 0 and calls[ATTN] == calls[WRITE] > 0


def test_compile_cache_keeps_the_states_apart(compiled):
    """Off after on, same cache: a graph compiled without the update op, run with vLLM's
    backend, would never write the KV cache. Off compiles its own graph instead."""
    on, off = compiled["on"], compiled["off"]
    counter = off["worker"]["compilation_counter"]
    assert counter["num_aot_artifacts_loaded"] == 0 and counter["num_aot_compiles"] == 1
    assert off["op_calls"][UPDATE] == off["op_calls"][ATTN] > 0
    assert off["tokens"] == on["tokens"]
