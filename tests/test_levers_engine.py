"""The KV-budget and arena-release patches change real allocations, and the per-step patches
(greedy sampler, slot-mapping binding) carry a real decode without changing its tokens
(one-process engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_edge.runtime.kv import kv_budget_for

pytestmark = pytest.mark.slow
PROBE = Path(__file__).parent / "support" / "engine_probe.py"
KV_BYTES = 64 << 20


def _probe(model_dir, extra_env: dict) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **extra_env}
    proc = subprocess.run([sys.executable, str(PROBE), str(model_dir), str(KV_BYTES)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    m = re.search(r"CPU KV cache size: ([\d,]+) tokens", proc.stdout + proc.stderr)
    out["logged_kv_tokens"] = int(m.group(1).replace(",", "")) if m else None
    return out


@pytest.fixture(scope="module")
def runs(default_model_dir):
    legacy = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # whole GiB; must lose to the explicit 64 MiB
    return {
        # the greedy sampler is off by default; this arm switches it on to carry a real decode
        "patched": _probe(default_model_dir, {**legacy, "VLLM_EDGE_PATCH_GREEDY_SAMPLER": "1"}),
        "unpatched": _probe(default_model_dir, {**legacy, "VLLM_EDGE_PATCH_KV_BUDGET": "0",
                                                "VLLM_EDGE_PATCH_ARENA_RELEASE": "0",
                                                "VLLM_EDGE_PATCH_WEIGHT_HUGE_PAGES": "0",
                                                "VLLM_EDGE_PATCH_GREEDY_SAMPLER": "0",
                                                "VLLM_EDGE_PATCH_SLOT_MAPPING_BIND": "0"}),
    }


def test_explicit_kv_budget_wins(runs, default_model_dir):
    cfg = json.loads((default_model_dir / "config.json").read_text())
    b = kv_budget_for(cfg, 16, 1)
    per_token = b.bytes_per_token_per_layer * b.num_layers  # all layers, one token
    r = runs["patched"]
    assert r["worker"]["patches"]["kv_budget"] == "applied"
    assert r["kv_cache_memory_bytes"] == KV_BYTES
    expected_tokens = KV_BYTES // per_token // r["block_size"] * r["block_size"]
    assert r["logged_kv_tokens"] == expected_tokens  # 2912 tokens: within block rounding
    assert r["num_blocks"] * r["block_size"] == expected_tokens


def test_without_the_patch_the_env_var_overrides(runs):
    r = runs["unpatched"]
    assert r["worker"]["patches"]["kv_budget"] == "disabled"
    assert r["kv_cache_memory_bytes"] == 1 << 30
    assert r["logged_kv_tokens"] > 15 * runs["patched"]["logged_kv_tokens"]


def test_arena_release_runs_in_the_worker_and_logs_rss(runs):
    releases = runs["patched"]["worker"]["arena_releases"]
    assert [r["tag"] for r in releases] == ["load_model", "determine_available_memory", "compile_or_warm_up_model"]
    for r in releases:
        assert r["allocator"] in ("glibc", "tcmalloc") and r["before_mb"] > 100
        assert r["after_mb"] <= r["before_mb"] + 1
    assert runs["unpatched"]["worker"]["arena_releases"] == []


def test_weights_collapse_into_huge_pages_in_the_worker(runs):
    """The patched worker collapsed part of the loaded weights (the tokens it then decodes equal
    the unpatched arm's: test_both_arms_generate); the unpatched one never ran it."""
    reports = runs["patched"]["worker"]["weight_huge_pages"]
    assert runs["patched"]["worker"]["patches"]["weight_huge_pages"] == "applied"
    assert len(reports) == 1
    rep = reports[0]
    if rep["state"] == "unsupported":
        pytest.skip(f"this kernel cannot collapse anonymous memory: {rep['errors']}")
    assert rep["weight_bytes"] > 50 << 20
    assert rep["collapsed_bytes"] >= 2 << 20 and rep["collapsed_bytes"] <= rep["weight_bytes"]
    assert runs["unpatched"]["worker"]["weight_huge_pages"] == []


def test_both_arms_generate(runs):
    assert runs["patched"]["text"] == runs["unpatched"]["text"]
    assert runs["patched"]["token_ids"] == runs["unpatched"]["token_ids"]
    assert "Paris" in runs["patched"]["text"]


def test_greedy_decode_runs_on_the_fast_sampler(runs):
    steps = runs["patched"]["worker"]["greedy_sampler_steps"]
    assert runs["patched"]["worker"]["patches"]["greedy_sampler"] == "applied"
    assert steps["fast"] >= len(runs["patched"]["token_ids"])  # every generated token
    assert runs["unpatched"]["worker"]["greedy_sampler_steps"] == {"fast": 0, "original": 0}


def _launch_binds(run: dict) -> int:
    # kernel_launcher's wrapper, the one that binds the slot-mapping launch
    return sum(f.endswith("model_executor/warmup/jit_warmup.py") for f in run["binds_in_generate"])


def test_no_signature_bind_per_step_with_the_slot_mapping_patch(runs):
    patched, unpatched = runs["patched"], runs["unpatched"]
    assert patched["worker"]["slot_mapping_fast_calls"] >= len(patched["token_ids"])
    assert _launch_binds(patched) == 0
    assert _launch_binds(unpatched) >= len(unpatched["token_ids"])  # one per step without it


def test_vllm_still_freezes_the_startup_heap(runs):
    # why the edge mode freezes only for start-up (docs/design/patches.md)
    assert runs["patched"]["worker"]["gc_frozen_objects"] > 10_000
