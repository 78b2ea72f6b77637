"""KV pricing against hand-computed values."""

from __future__ import annotations

import pytest

from vllm_edge.runtime.kv import kv_budget_for

SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576, "head_dim": 64}
# Gemma-3-270M-like: 18 layers, 1 KV head of 256, window 512, every 6th layer global.
GEMMA3 = {"text_config": {"num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
                          "hidden_size": 640, "head_dim": 256, "sliding_window": 512,
                          "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3}}


def test_smollm2_flat():
    b = kv_budget_for(SMOLLM2, max_model_len=2048, max_num_seqs=4, kv_dtype="bfloat16", block_size=16)
    # 2 (K,V) * 3 heads * 64 dim * 2 bytes = 768 B per token per layer
    assert b.bytes_per_token_per_layer == 768
    assert b.null_block_bytes == 30 * 768 * 16
    assert b.flat_bytes == 30 * 768 * 2048 * 4 + 30 * 768 * 16 == 189_112_320
    assert b.hybrid_bytes == b.flat_bytes


def test_block_rounding():
    b = kv_budget_for(SMOLLM2, max_model_len=1000, max_num_seqs=1, block_size=16)
    assert b.tokens_per_seq == 1008
    assert b.flat_bytes == 30 * 768 * (1008 + 16)


def test_gemma3_hybrid():
    b = kv_budget_for(GEMMA3, max_model_len=2048, max_num_seqs=2, kv_dtype="bf16", block_size=16)
    per = 2 * 1 * 256 * 2  # 1024 B
    assert b.bytes_per_token_per_layer == per
    assert b.sliding_layers == 15
    null = 18 * per * 16
    assert b.flat_bytes == 18 * per * 2048 * 2 + null
    assert b.hybrid_bytes == (3 * 2048 + 15 * 512) * per * 2 + null
    assert b.hybrid_bytes < b.flat_bytes


def test_gemma3_pattern_form_and_short_context():
    cfg = dict(GEMMA3["text_config"])
    del cfg["layer_types"]
    cfg["sliding_window_pattern"] = 6
    b = kv_budget_for(cfg, max_model_len=256)
    assert b.sliding_layers == 15
    # The window is longer than the context: sliding layers cost the same as full ones.
    assert b.hybrid_bytes == b.flat_bytes


def test_fp32_and_bad_input():
    assert kv_budget_for(SMOLLM2, 16, kv_dtype="float32").flat_bytes == 30 * 1536 * (16 + 16)
    with pytest.raises(ValueError, match="kv dtype"):
        kv_budget_for(SMOLLM2, 16, kv_dtype="int3")
    with pytest.raises(ValueError):
        kv_budget_for(SMOLLM2, 0)


def test_one_rank_holds_its_heads_and_its_stage():
    # TP=2 over 4 KV heads: 2 per rank; PP=4 over 30 layers: stages of at most 8
    cfg = dict(SMOLLM2, num_attention_heads=12, num_key_value_heads=4)
    b = kv_budget_for(cfg, 1024, tensor_parallel_size=2, pipeline_parallel_size=4, block_size=16)
    assert (b.bytes_per_token_per_layer, b.num_layers) == (2 * 2 * 64 * 2, 8)
    assert b.flat_bytes == 8 * 512 * (1024 + 16)
    # fewer KV heads than ranks: vLLM replicates, each rank holds one whole head
    one = kv_budget_for(SMOLLM2, 1024, tensor_parallel_size=8, block_size=16)
    assert one.bytes_per_token_per_layer == 2 * 1 * 64 * 2
    with pytest.raises(ValueError):
        kv_budget_for(SMOLLM2, 1024, tensor_parallel_size=0)


@pytest.mark.parametrize("field, value", [
    ("sliding_window_pattern", 0), ("sliding_window_pattern", "0"), ("sliding_window_pattern", -6),
    ("num_hidden_layers", 0), ("num_attention_heads", 0), ("num_attention_heads", -8),
    ("num_key_value_heads", 0), ("head_dim", -1), ("sliding_window", 0), ("hidden_size", "640"),
])
def test_zero_or_negative_sizes_are_refused_naming_the_field(field, value):
    """sliding_window_pattern 0 once divided by zero; the other sizes gave nonsense budgets."""
    from vllm_edge.common.errors import EdgeError

    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 640, "head_dim": 80, "sliding_window": 512, "sliding_window_pattern": 2}
    if field == "hidden_size":
        del cfg["head_dim"]
    cfg[field] = value
    with pytest.raises(EdgeError, match=f"field {field}={value!r}; expected a positive integer"):
        kv_budget_for(cfg, 2048)
