"""The edge mode's engine arguments (no engine started)."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import attention_split, engine


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
    # an engine an earlier test started in this process may have left its value behind
    monkeypatch.delenv("VLLM_CPU_ATTN_SPLIT_KV", raising=False)
    from vllm_edge.common.hw import probe_cpu
    from vllm_edge.runtime import activations

    for name in activations.SWITCHES:
        monkeypatch.delenv(name, raising=False)
    act8 = "1" if probe_cpu().isa.get("avx512_vnni") else "0"
    edge = engine.edge_engine(default_model_dir, enforce_eager=True)
    assert edge.env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
                        "VLLM_CPU_ATTN_SPLIT_KV": "0", **{name: act8 for name in activations.SWITCHES}}
    multi = engine.edge_engine(default_model_dir, one_process=False)
    assert "OMP_NUM_THREADS" not in multi.env


def test_attention_split_is_off_where_each_thread_keeps_a_kv_head(default_model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_ATTN_SPLIT_KV", raising=False)
    monkeypatch.setenv("VLLM_EDGE_THREADS", "2")  # the default model has 3 KV heads
    edge = engine.edge_engine(default_model_dir, enforce_eager=True)
    assert edge.env["VLLM_CPU_ATTN_SPLIT_KV"] == "0"
    assert "same with and without speculation" in edge.reasons["VLLM_CPU_ATTN_SPLIT_KV"]
    # with two ranks of tensor parallelism a rank holds one KV head: each of its threads
    # would not have one, so vLLM's split stays
    env, reasons = {}, {}
    attention_split.apply(env, reasons, kv_heads=1, threads=2)
    assert env == {} and "leave threads idle" in reasons["VLLM_CPU_ATTN_SPLIT_KV"]
    attention_split.apply(env, reasons, kv_heads=2, threads=2)
    assert env == {"VLLM_CPU_ATTN_SPLIT_KV": "0"}
    for given, warned in (("1", True), ("0", False)):
        monkeypatch.setenv("VLLM_CPU_ATTN_SPLIT_KV", given)
        edge = engine.edge_engine(default_model_dir, enforce_eager=True)
        why = edge.reasons["VLLM_CPU_ATTN_SPLIT_KV"]
        assert "VLLM_CPU_ATTN_SPLIT_KV" not in edge.env  # the user's value stays as it is
        assert f"={given} given in the environment" in why
        assert ("can part at a near tie" in why) is warned


def test_budget_below_one_sequence_names_the_minimum(default_model_dir):
    with pytest.raises(ValueError, match=r"minimum is \d+ bytes"):
        engine.edge_engine(default_model_dir, kv_cache_memory_bytes=1 << 20)


def _layout(cores, tp=2, pp=1, nnodes=1, one_process=True):
    kwargs, reasons, env = {}, {}, {}
    engine.parallel_layout(kwargs, reasons, env, cores, tp, pp, nnodes, one_process, server=False)
    return kwargs, reasons, env


def test_ranks_share_the_allowed_cores_evenly(monkeypatch):
    monkeypatch.delenv(engine.BIND_ENV, raising=False)
    kwargs, reasons, env = _layout([0, 1])
    assert env[engine.BIND_ENV] == "0|1" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert kwargs == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1,
                      "distributed_executor_backend": "mp"}
    _, reasons, env = _layout([2, 3, 4, 5, 6], tp=1, pp=2)
    assert env[engine.BIND_ENV] == "2,3|4,5" and "[6] stay with the scheduler" in reasons[engine.BIND_ENV]
    # two nodes of one rank each: this machine binds its one rank to every allowed core
    _, _, env = _layout([0, 1], nnodes=2)
    assert env[engine.BIND_ENV] == "0,1"


def test_a_binding_the_user_set_is_kept_and_too_few_cores_are_refused(monkeypatch):
    monkeypatch.setenv(engine.BIND_ENV, "0-3|4-7")
    _, reasons, env = _layout([0])
    assert engine.BIND_ENV not in env and reasons[engine.BIND_ENV] == "given in the environment"
    monkeypatch.setenv(engine.BIND_ENV, "auto")  # vLLM's default is replaced, not kept
    with pytest.raises(ValueError, match=r"4 ranks on this machine need at least one core each, but only 2"):
        _layout([0, 1], tp=2, pp=2)
    with pytest.raises(ValueError, match="--nnodes 3 must divide the 2 ranks"):
        _layout([0, 1], nnodes=3)


def test_the_kv_budget_is_priced_per_rank(default_model_dir):
    one = engine.edge_engine(default_model_dir, max_model_len=512, max_num_seqs=1)
    two = engine.edge_engine(default_model_dir, max_model_len=512, max_num_seqs=1, pipeline_parallel_size=2)
    # 30 layers: a stage holds 15 of them, and the null block shrinks with them
    assert two.kwargs["kv_cache_memory_bytes"] * 2 == one.kwargs["kv_cache_memory_bytes"]
    assert "per rank" in two.reasons["kv_cache_memory_bytes"]
