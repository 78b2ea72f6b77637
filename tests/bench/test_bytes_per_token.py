"""Bytes per decoded token against hand-computed values (SmolLM2-135M's shapes)."""

from __future__ import annotations

import json

import pytest

from vllm_edge.bench import bytes_per_token as bpt
from vllm_edge.bench.bytes_per_token import AccountingError, TensorSpec
from vllm_edge.quant.groups import DEFAULT_GROUP

# SmolLM2-135M-Instruct: hidden 576, 30 layers, 9 heads of 64, 3 KV heads, MLP 1536,
# vocab 49152, head tied to the embedding.
SMOL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
LINEARS = {"self_attn.q_proj": (576, 576), "self_attn.k_proj": (192, 576),
           "self_attn.v_proj": (192, 576), "self_attn.o_proj": (576, 576),
           "mlp.gate_proj": (1536, 576), "mlp.up_proj": (1536, 576), "mlp.down_proj": (576, 1536)}

# By hand. Per layer the projections hold 2*576*576 + 2*192*576 + 3*1536*576 = 3,538,944
# weights; 30 layers = 106,168,320. The head (= embedding) is 49152*576 = 28,311,552.
# Norms: 2*576 per layer + 576 final = 35,136 weights.
LINEAR_W = 106_168_320
HEAD_W = 28_311_552
NORM_W = 35_136
# bf16: 2 B per weight; the embedding lookup reads one 576-wide row (1152 B).
BF16_TOTAL = 2 * LINEAR_W + 2 * HEAD_W + 2 * NORM_W + 1152
assert BF16_TOTAL == 269_031_168
# cpu_int4 g64 (K = 576 and 1536 are multiples of 64): 0.5 B of nibbles + (scale, zero)
# bf16 per 64 weights = 4/64 B, so 0.5625 B = 4.5 bits per weight; one embedding row is
# 288 B of nibbles + 9 groups x 4 B = 324 B.
INT4_TOTAL = 0.5625 * LINEAR_W + 0.5625 * HEAD_W + 2 * NORM_W + 324
assert INT4_TOTAL == 75_715_524
# cpu_int4 g32, the default group: 0.5 B of nibbles + 4/32 B of pairs = 0.625 B = 5 bits per
# weight; one embedding row is 288 B of nibbles + 18 groups x 4 B = 360 B.
INT4_G32_TOTAL = 0.625 * LINEAR_W + 0.625 * HEAD_W + 2 * NORM_W + 360
assert INT4_G32_TOTAL == 84_120_552
# group -> (bytes per linear or head weight, embedding row bytes, total, bits per weight)
INT4_BY_GROUP = {32: (0.625, 360, INT4_G32_TOTAL, 5.0), 64: (0.5625, 324, INT4_TOTAL, 4.5)}
# KV: 30 layers x (K and V) x 3 heads x 64 x 2 B
KV_PER_TOKEN = 30 * 2 * 3 * 64 * 2
assert KV_PER_TOKEN == 23_040


def bf16_specs(tied: bool = True) -> dict[str, TensorSpec]:
    s = {"model.embed_tokens.weight": TensorSpec("BF16", (49152, 576)),
         "model.norm.weight": TensorSpec("BF16", (576,))}
    for i in range(30):
        for m, shape in LINEARS.items():
            s[f"model.layers.{i}.{m}.weight"] = TensorSpec("BF16", shape)
        s[f"model.layers.{i}.input_layernorm.weight"] = TensorSpec("BF16", (576,))
        s[f"model.layers.{i}.post_attention_layernorm.weight"] = TensorSpec("BF16", (576,))
    if not tied:
        s["lm_head.weight"] = TensorSpec("BF16", (49152, 576))
    return s


def int4_parts(base: str, n: int, k: int, group: int) -> dict[str, TensorSpec]:
    g = -(-k // group)
    return {f"{base}.weight_packed": TensorSpec("U8", (n, k // 2)),
            f"{base}.weight_scale": TensorSpec("BF16", (n, g)),
            f"{base}.weight_zero": TensorSpec("BF16", (n, g))}


def int4_specs(group: int = DEFAULT_GROUP) -> dict[str, TensorSpec]:
    """What `vllm-edge quantize --quant cpu_int4` writes: the head untied and quantized."""
    s = {"model.norm.weight": TensorSpec("BF16", (576,))}
    s |= int4_parts("model.embed_tokens", 49152, 576, group)
    s |= int4_parts("lm_head", 49152, 576, group)
    for i in range(30):
        for m, (n, k) in LINEARS.items():
            s |= int4_parts(f"model.layers.{i}.{m}", n, k, group)
        s[f"model.layers.{i}.input_layernorm.weight"] = TensorSpec("BF16", (576,))
        s[f"model.layers.{i}.post_attention_layernorm.weight"] = TensorSpec("BF16", (576,))
    return s


def int4_config(group: int = DEFAULT_GROUP) -> dict:
    return {**SMOL, "tie_word_embeddings": False,
            "quantization_config": {"quant_method": "cpu_int4", "bits": 4, "group_size": group}}


def test_smollm2_bf16_tied_head():
    acc = bpt.account(SMOL, bf16_specs(), dtype="bfloat16")
    assert acc.head_tied
    assert acc.linear_bytes == 2 * LINEAR_W
    assert acc.head_bytes == 2 * HEAD_W  # the tied head reads the whole embedding matrix
    assert acc.embedding_row_bytes == 1152  # the lookup reads one row
    assert acc.embedding_table_bytes == 2 * HEAD_W
    assert acc.other_bytes == 2 * NORM_W
    assert acc.weight_bytes_per_token == BF16_TOTAL
    assert acc.bits_per_weight() == {"linears": 16.0, "head": 16.0, "linears_and_head": 16.0}
    assert any("tied" in n for n in acc.notes) and any("one row" in n for n in acc.notes)


def test_untied_bf16_head_is_counted_once():
    acc = bpt.account({**SMOL, "tie_word_embeddings": False}, bf16_specs(tied=False))
    assert not acc.head_tied and acc.weight_bytes_per_token == BF16_TOTAL


def test_float32_checkpoint_is_read_at_the_engine_dtype():
    specs = {k: TensorSpec("F32", v.shape) for k, v in bf16_specs().items()}
    assert bpt.account(SMOL, specs, dtype="bfloat16").weight_bytes_per_token == BF16_TOTAL
    assert bpt.account(SMOL, specs, dtype="float32").weight_bytes_per_token == 2 * BF16_TOTAL


@pytest.mark.parametrize("group", [DEFAULT_GROUP, 64])
def test_smollm2_cpu_int4(group):
    """The default group, and g64 (the faster build when fidelity allows)."""
    per_weight, row, total, bits = INT4_BY_GROUP[group]
    acc = bpt.account(int4_config(group), int4_specs(group))
    assert not acc.head_tied
    assert acc.linear_bytes == per_weight * LINEAR_W
    assert acc.head_bytes == per_weight * HEAD_W
    assert acc.embedding_row_bytes == row
    assert acc.weight_bytes_per_token == total
    assert acc.bits_per_weight()["linears_and_head"] == bits
    assert acc.layout == "cpu_int4 tinygemm"


def test_cpu_int4_g128_reads_scales_at_the_kernel_group():
    # K=576 is not a multiple of 128: tinygemm runs groups of 64 with duplicated scales,
    # so a [576, 576] linear reads 576*288 B of nibbles + (576/64)*576*4 B of pairs,
    # not the 5 stored groups per row.
    cfg = {**int4_config(128), "num_hidden_layers": 1}
    specs = int4_parts("model.layers.0.self_attn.o_proj", 576, 576, 128)
    specs |= int4_parts("lm_head", 49152, 576, 128)
    acc = bpt.account(cfg, specs)
    assert acc.linear_bytes == 576 * 288 + 9 * 576 * 4
    assert specs["model.layers.0.self_attn.o_proj.weight_scale"].shape == (576, 5)
    # K=1536 is a multiple of 128: groups stay 128 (1536/128 = 12 pairs per row)
    specs2 = int4_parts("model.layers.0.mlp.down_proj", 576, 1536, 128) | int4_parts("lm_head", 16, 576, 128)
    acc2 = bpt.account(cfg, specs2)
    assert acc2.linear_bytes == 576 * 768 + 12 * 576 * 4


def test_tied_int4_head_reads_the_quantized_embedding():
    cfg = {**int4_config(), "tie_word_embeddings": True}
    specs = {k: v for k, v in int4_specs().items() if not k.startswith("lm_head")}
    acc = bpt.account(cfg, specs)
    assert acc.head_tied and acc.head_bytes == 0.625 * HEAD_W
    assert acc.weight_bytes_per_token == INT4_G32_TOTAL


def test_kv_cache_at_depth():
    acc = bpt.account(SMOL, bf16_specs())
    assert acc.kv_bytes_per_context_token == KV_PER_TOKEN
    assert acc.per_token(1024) == BF16_TOTAL + 1024 * KV_PER_TOKEN
    assert bpt.account(SMOL, bf16_specs(), kv_dtype="fp8").kv_bytes_per_context_token == KV_PER_TOKEN // 2
    # the tg measurement times tokens 2..N of a P-token prompt: mean context P + N/2
    assert bpt.mean_context(1024, 128) == 1088
    rows = bpt.summary(acc, [("tg128_at_d1024_tps", 1088)])
    assert rows["tg128_at_d1024_tps"] == {"context_tokens": 1088, "weight_bytes": BF16_TOTAL,
                                          "kv_bytes": 1088 * KV_PER_TOKEN,
                                          "bytes_per_token": BF16_TOTAL + 1088 * KV_PER_TOKEN}


def test_gptq_is_counted_as_stored():
    cfg = {**SMOL, "num_hidden_layers": 1, "tie_word_embeddings": False,
           "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64}}
    specs = {"model.layers.0.mlp.down_proj.qweight": TensorSpec("I32", (1536 // 8, 576)),
             "model.layers.0.mlp.down_proj.scales": TensorSpec("F16", (24, 576)),
             "model.layers.0.mlp.down_proj.qzeros": TensorSpec("I32", (24, 576 // 8)),
             "model.layers.0.mlp.down_proj.g_idx": TensorSpec("I32", (1536,)),
             "lm_head.weight": TensorSpec("BF16", (16, 576))}
    acc = bpt.account(cfg, specs)
    assert acc.linear_params == 1536 * 576
    assert acc.linear_bytes == 192 * 576 * 4 + 24 * 576 * 2 + 24 * 72 * 4 + 1536 * 4
    assert any("as stored" in n for n in acc.notes)


def test_bad_checkpoints_name_the_problem():
    with pytest.raises(AccountingError, match="no lm_head tensors, and tie_word_embeddings is false"):
        bpt.account({**SMOL, "tie_word_embeddings": False}, bf16_specs())
    specs = int4_specs()
    del specs["model.layers.3.mlp.up_proj.weight_zero"]
    with pytest.raises(AccountingError, match=r"model\.layers\.3\.mlp\.up_proj\.weight_zero"):
        bpt.account(int4_config(), specs)
    with pytest.raises(AccountingError, match="num_hidden_layers"):
        bpt.account({k: v for k, v in SMOL.items() if k != "num_hidden_layers"}, bf16_specs())
    with pytest.raises(AccountingError, match="unknown engine dtype"):
        bpt.account(SMOL, bf16_specs(), dtype="int3")


def test_headers_of_a_real_safetensors_file(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    cfg = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "vocab_size": 128, "tie_word_embeddings": True}
    tensors = {"model.embed_tokens.weight": torch.zeros(128, 64, dtype=torch.bfloat16),
               "model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64, dtype=torch.float32),
               "model.layers.0.input_layernorm.weight": torch.zeros(64, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    specs = bpt.read_specs(tmp_path)
    assert specs["model.layers.0.self_attn.q_proj.weight"] == TensorSpec("F32", (64, 64))
    acc = bpt.account_dir(tmp_path)
    # q_proj read as bf16, the tied head = the whole embedding, one embedding row, the norm
    assert acc.weight_bytes_per_token == 64 * 64 * 2 + 128 * 64 * 2 + 64 * 2 + 64 * 2
    assert acc.kv_bytes_per_context_token == 1 * 2 * 1 * 32 * 2
    with pytest.raises(AccountingError, match="nowhere/config.json: no such file"):
        bpt.account_dir(tmp_path / "nowhere")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(AccountingError, match="no \\*.safetensors"):
        bpt.account_dir(tmp_path)


def test_the_default_builds_match_the_hand_count(default_model_dir, default_int4_dir):
    """The real checkpoints (bf16, and cpu_int4 at the default group), prepared by the fixtures."""
    assert bpt.account_dir(default_model_dir).weight_bytes_per_token == BF16_TOTAL
    assert bpt.account_dir(default_int4_dir).weight_bytes_per_token == INT4_G32_TOTAL


def test_a_gguf_repacks_int8_modules_count_at_the_bits_decode_reads():
    """A cpu_int8 module (a GGUF's Q5_0 codes in 8 bits on disk) counts as stored, or at the
    bits its repack report gives where this CPU packs it (quant/lowbit.py): 5 bits of code and
    an fp16 scale per 32 for Q5_0, against 8 bits, a scale and an offset on disk."""
    n, k = 576, 576
    specs = {"model.embed_tokens.weight": TensorSpec("BF16", (49152, 576)),
             "model.norm.weight": TensorSpec("BF16", (576,)),
             "model.layers.0.self_attn.o_proj.weight_int8": TensorSpec("I8", (n, k)),
             "model.layers.0.self_attn.o_proj.weight_scale": TensorSpec("F16", (n, k // 32)),
             "model.layers.0.self_attn.o_proj.weight_zero": TensorSpec("F16", (n, k // 32))}
    cfg = dict(SMOL, num_hidden_layers=1, quantization_config={"quant_method": "cpu_int4", "group_size": 32})
    stored = bpt.account(cfg, specs)
    packed = bpt.account(cfg, specs, int8_bits={"model.layers.0.self_attn.o_proj": 5.5})
    assert stored.linear_bytes == n * k + 2 * 2 * n * k // 32 and stored.linear_params == n * k
    assert packed.linear_bytes == n * k * 5.5 / 8
    assert packed.bits_per_weight()["linears"] == 5.5
