"""cpu_int4 through vLLM's own layers and shard loaders: merged QKV / gate-up, row
parallel, fallback shapes, the tied head, and bad checkpoints."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.quant import pack
from vllm_edge.quant.config import CpuInt4Config
from vllm_edge.quant.linear import CheckpointError

PREFIX = "model.layers.0"


def _cfg(group=128, **kw):
    cfg = CpuInt4Config(group_size=group, **kw)
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                  "gate_up_proj": ["gate_proj", "up_proj"]}
    return cfg


def _quantized(rows, cols, group):
    w = torch.randn(rows, cols) * 0.05
    q, s, z = pack.quantize(w, group)
    p = pack.pack_nibbles(q)
    return {"weight_packed": p, "weight_scale": s, "weight_zero": z}, pack.dequantize_plain(p, s, z, group)


def _load(layer, tensors, shard_id=None):
    for name, t in tensors.items():
        param = getattr(layer, name)
        if shard_id is None:
            param.weight_loader(param, t)
        else:
            param.weight_loader(param, t, shard_id)


def _check(layer, ref, rows=(1, 2, 8, 512)):
    for m in rows:
        x = torch.randn(m, ref.shape[1], dtype=torch.bfloat16)
        out = layer(x)
        out = out[0] if isinstance(out, tuple) else out
        expect = x.float() @ ref.t()
        assert (out.float() - expect).abs().max() <= 0.01 * expect.abs().max()


def _qkv(cfg):
    from vllm.model_executor.layers.linear import QKVParallelLinear

    return QKVParallelLinear(576, 64, 9, 3, bias=False, quant_config=cfg,
                             prefix=f"{PREFIX}.self_attn.qkv_proj", params_dtype=torch.bfloat16)


@pytest.mark.parametrize("group", [128, 32])
def test_qkv_shards_load_and_match(vllm_dist, group):
    layer = _qkv(_cfg(group))
    refs = []
    for sid, rows in (("q", 576), ("k", 192), ("v", 192)):
        t, ref = _quantized(rows, 576, group)
        _load(layer, t, sid)
        refs.append(ref)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.cpu_int4_mode == "tinygemm"
    assert set(dict(layer.named_parameters())) == {"weight_packed", "weight_sz"}  # one copy
    _check(layer, torch.cat(refs))


@pytest.mark.parametrize("group", [64, 32])
def test_gate_up_and_down(vllm_dist, group):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

    gu = MergedColumnParallelLinear(576, [1536, 1536], bias=False, quant_config=_cfg(group),
                                    prefix=f"{PREFIX}.mlp.gate_up_proj", params_dtype=torch.bfloat16)
    refs = []
    for sid in (0, 1):
        t, ref = _quantized(1536, 576, group)
        _load(gu, t, sid)
        refs.append(ref)
    gu.quant_method.process_weights_after_loading(gu)
    assert gu.cpu_int4_mode == "tinygemm" and gu.cpu_int4_kgroup == group
    _check(gu, torch.cat(refs))

    down = RowParallelLinear(1536, 576, bias=False, quant_config=_cfg(group),
                             prefix=f"{PREFIX}.mlp.down_proj", params_dtype=torch.bfloat16)
    t, ref = _quantized(576, 1536, group)
    _load(down, t)
    down.quant_method.process_weights_after_loading(down)
    _check(down, ref)


def test_unsupported_shape_falls_back_correctly(vllm_dist):
    from vllm.model_executor.layers.linear import ReplicatedLinear

    layer = ReplicatedLinear(128, 40, bias=False, quant_config=_cfg(64), prefix="odd_proj",
                             params_dtype=torch.bfloat16)  # 40 rows: not a multiple of 16
    t, ref = _quantized(40, 128, 64)
    _load(layer, t)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.cpu_int4_mode == "fallback"
    _check(layer, ref)


def test_direct_dequant_off_keeps_a_plain_copy(vllm_dist):
    layer = _qkv(_cfg(direct_dequant=False))
    refs = []
    for sid, rows in (("q", 576), ("k", 192), ("v", 192)):
        t, ref = _quantized(rows, 576, 128)
        _load(layer, t, sid)
        refs.append(ref)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.cpu_int4_mode == "tinygemm+plain" and hasattr(layer, "weight_plain")
    _check(layer, torch.cat(refs))


@pytest.mark.parametrize("group", [64, 32])
def test_tied_head_is_quantized_and_embedding_reads_the_same_data(vllm_dist, group):
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    cfg = _cfg(group)
    vocab, dim = 1024, 128
    embed = VocabParallelEmbedding(vocab, dim, params_dtype=torch.bfloat16, quant_config=cfg,
                                   prefix="model.embed_tokens")
    head = ParallelLMHead(vocab, dim, params_dtype=torch.bfloat16, quant_config=cfg, prefix="lm_head")
    head = head.tie_weights(embed)
    t, ref = _quantized(vocab, dim, group)
    _load(embed, t)
    for module in (embed, head):  # vLLM's order: named_modules()
        module.quant_method.process_weights_after_loading(module)
    assert not list(head.parameters(recurse=False))  # no own copy: reads embed's packed data
    x = torch.randn(1, dim, dtype=torch.bfloat16)
    logits = head.quant_method.apply(head, x)
    expect = x.float() @ ref.t()
    assert (logits.float() - expect).abs().max() <= 0.01 * expect.abs().max()
    ids = torch.tensor([0, 7, 1023, 512])
    rows = embed(ids)
    assert rows.dtype == torch.bfloat16
    assert (rows.float() - ref[ids]).abs().max() <= ref.abs().max() * 2 ** -8


# --- bad checkpoints ------------------------------------------------------------------

def test_missing_weight_scale_names_the_tensor(vllm_dist):
    layer = _qkv(_cfg())
    for sid, rows in (("q", 576), ("k", 192), ("v", 192)):
        t, _ = _quantized(rows, 576, 128)
        if sid == "k":
            del t["weight_scale"]
        _load(layer, t, sid)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight_scale"):
        layer.quant_method.process_weights_after_loading(layer)


@pytest.mark.parametrize("made,config", [(64, 128), (64, 32), (32, 64)])
def test_wrong_group_size_names_the_tensor(vllm_dist, made, config):
    layer = _qkv(_cfg(config))
    t, _ = _quantized(576, 576, made)  # produced with one group size, the config says another
    with pytest.raises(CheckpointError,
                       match=rf"q_proj\.weight_scale.*group size {made}\b.*group_size is {config}"):
        _load(layer, t, "q")


def test_wrong_packed_shape_names_the_tensor(vllm_dist):
    layer = _qkv(_cfg())
    t, _ = _quantized(192, 576, 128)
    bad = torch.zeros(192, 576 // 8, dtype=torch.int32)  # GPTQ-style int32 packing
    with pytest.raises(CheckpointError, match=r"v_proj\.weight_packed: expected uint8 \[rows, 288\]"):
        layer.weight_packed.weight_loader(layer.weight_packed, bad, "v")


def test_bad_group_in_config_is_rejected():
    with pytest.raises(ValueError, match="group_size=96.*expected one of"):
        CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 96})
    with pytest.raises(ValueError, match="group_size=16"):
        CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 16})
    assert CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32}).group_size == 32


@pytest.mark.parametrize("name, bad", [("weight_scale", float("nan")), ("weight_zero", float("inf"))])
def test_nan_or_inf_scale_is_refused_naming_the_tensor(vllm_dist, name, bad):
    layer = _qkv(_cfg(32))
    for sid, rows in (("q", 576), ("k", 192), ("v", 192)):
        t, _ = _quantized(rows, 576, 32)
        t[name][3, 1] = bad
        _load(layer, t, sid)
    with pytest.raises(CheckpointError, match=rf"qkv_proj\.{name}: holds NaN or inf values"):
        layer.quant_method.process_weights_after_loading(layer)


def test_a_tensor_parallel_slice_that_cuts_a_group_is_refused_by_name():
    """Row-parallel: each rank gets input_size / tp columns and the matching scale columns;
    a slice that is not whole groups would load the wrong scales, so loading stops."""
    from vllm_edge.quant.linear import CpuInt4LinearMethod

    method = CpuInt4LinearMethod(_cfg(32), prefix=f"{PREFIX}.mlp.down_proj")
    with pytest.raises(CheckpointError) as exc:
        method.make_weights(torch.nn.Module(), 400, [256], 800, weight_loader=lambda *a: None)
    msg = str(exc.value)
    assert f"{PREFIX}.mlp.down_proj" in msg and "2 tensor-parallel ranks" in msg
    assert "800 input columns" in msg and "each rank 400" in msg and "group 32" in msg
    whole = torch.nn.Module()  # 384 = 12 whole groups per rank
    method.make_weights(whole, 384, [256], 768, weight_loader=lambda *a: None)
    assert whole.weight_scale.shape == (256, 12) and whole.weight_packed.shape == (256, 192)
    assert not whole.weight_scale.any()  # unloaded rows (vocabulary padding) stay finite
