"""The edge mode's engine arguments (no engine started)."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import engine


def test_threads_follow_allowed_cores_by_default(monkeypatch):
    monkeypatch.delenv("VLLM_EDGE_THREADS", raising=False)
    n, why = engine.thread_count([0, 1, 2])
    assert n == 3 and "all 3 allowed cores" in why


def test_threads_env_lowers_and_is_capped_at_the_cores(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_THREADS", "1")
    assert engine.thread_count([0, 1])[0] == 1
    monkeypatch.setenv("VLLM_EDGE_THREADS", "8")
    n, why = engine.thread_count([0, 1])
    assert n == 2 and "capped" in why
    monkeypatch.setenv("VLLM_EDGE_THREADS", "0")
    with pytest.raises(ValueError, match="VLLM_EDGE_THREADS='0': must be at least 1"):
        engine.thread_count([0, 1])


def test_one_process_env_carries_the_thread_choice(default_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_THREADS", "1")
    edge = engine.edge_engine(default_model_dir)
    assert edge.env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    multi = engine.edge_engine(default_model_dir, one_process=False)
    assert "OMP_NUM_THREADS" not in multi.env


def test_budget_below_one_sequence_names_the_minimum(default_model_dir):
    with pytest.raises(ValueError, match=r"minimum is \d+ bytes"):
        engine.edge_engine(default_model_dir, kv_cache_memory_bytes=1 << 20)
