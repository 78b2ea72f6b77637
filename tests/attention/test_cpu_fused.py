"""The fused-KV CPU backend against vLLM's own: same class contract, same cache and output
bits from one call as from upstream's update op followed by its attention, and per-layer
cache views that follow a new cache tensor."""

from __future__ import annotations

import types

import pytest
import torch

HEADS, KV_HEADS, HEAD, BLOCK, BLOCKS = 4, 2, 64, 32, 8
DTYPE = torch.bfloat16


@pytest.fixture(scope="module")
def cpu_attn():
    from vllm.v1.attention.backends import cpu_attn

    return cpu_attn


@pytest.fixture
def impls(cpu_attn, monkeypatch):
    """(upstream impl, fused impl), built as the layer builds them."""
    from vllm_edge.attention.cpu_fused import FusedKVCPUAttentionImpl

    # Their __init__ reads only the model dtype from the current config.
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=DTYPE))
    monkeypatch.setattr(cpu_attn, "get_current_vllm_config", lambda: config)
    args = (HEADS, HEAD, HEAD ** -0.5, KV_HEADS, None, None, "auto")
    return cpu_attn.CPUAttentionBackendImpl(*args), FusedKVCPUAttentionImpl(*args)


def test_backend_is_upstreams_with_the_update_inside_forward(cpu_attn):
    from vllm_edge.attention.cpu_fused import FusedKVCPUAttentionBackend, FusedKVCPUAttentionImpl

    b = FusedKVCPUAttentionBackend
    assert issubclass(b, cpu_attn.CPUAttentionBackend)
    assert b.forward_includes_kv_cache_update and not cpu_attn.CPUAttentionBackend.forward_includes_kv_cache_update
    assert b.get_name() == "CPU_ATTN"  # Attention looks its enum member up by this name
    assert issubclass(b.get_impl_cls(), cpu_attn.CPUAttentionBackendImpl)
    assert b.get_impl_cls() is FusedKVCPUAttentionImpl
    # Upstream's builder, resolving _get_attn_isa in upstream's module at call time: the
    # amx_attention patch, which replaces that module attribute, still decides layer.isa.
    builder = b.get_builder_cls()
    assert builder is cpu_attn.CPUAttentionMetadataBuilder
    assert builder.__init__.__globals__ is vars(cpu_attn)
    assert b.supported_kv_cache_layouts() == cpu_attn.CPUAttentionBackend.supported_kv_cache_layouts()


def test_cache_views_are_kept_until_the_cache_tensor_changes(impls):
    _, fused = impls
    kv = torch.zeros(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD, dtype=DTYPE)
    k, v = fused.kv_views(kv)
    assert fused.kv_views(kv)[0] is k and fused.kv_views(kv)[1] is v  # cached: same objects
    # Upstream's split: the first and second half of each block's rows.
    assert k.shape == v.shape == (BLOCKS, KV_HEADS, BLOCK, HEAD)
    assert k.data_ptr() == kv.data_ptr()
    assert v.data_ptr() == kv.data_ptr() + BLOCK * HEAD * kv.element_size()
    kv[1, 0, 3, :HEAD] = 1.0
    kv[1, 0, 3, HEAD:] = 2.0
    rows = kv.view(BLOCKS, KV_HEADS, 2 * BLOCK, HEAD)
    assert torch.equal(k, rows[:, :, :BLOCK]) and torch.equal(v, rows[:, :, BLOCK:])

    other = torch.zeros_like(kv)  # a re-bound cache: same shape, new tensor
    k2, v2 = fused.kv_views(other)
    assert k2 is not k and k2.data_ptr() == other.data_ptr()
    assert fused.kv_views(other)[0] is k2
    assert fused.kv_views(kv)[0].data_ptr() == kv.data_ptr()  # and back


def _isa(cpu_attn) -> str:
    isa = cpu_attn._get_attn_isa(DTYPE, BLOCK, HEAD, "auto")
    return "vec" if isa == "amx" else isa  # what the amx_attention patch gives (plugin default)


def _metadata(cpu_attn, isa, seq_lens, query_lens, slot_mapping, block_table, num_actual):
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    from vllm import _custom_ops as ops

    sched = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(query_lens), num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD,
        seq_lens=seq_lens, dtype=DTYPE, query_start_loc=qsl, causal=True,
        sliding_window_size=-1, isa=isa, enable_kv_split=True)
    return cpu_attn.CPUAttentionMetadata(
        num_actual_tokens=num_actual, max_query_len=max(query_lens), query_start_loc=qsl,
        max_seq_len=max(seq_lens.tolist()), seq_lens=seq_lens,
        block_table=torch.tensor(block_table, dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64), scheduler_metadata=sched)


def test_one_call_writes_and_attends_as_upstreams_two(cpu_attn, impls):
    """A prefill of two sequences (one spanning two blocks), then a decode step whose
    tokens are padded by one row, as the runner pads for a separate update op only."""
    ref, fused = impls
    isa = _isa(cpu_attn)
    layer = types.SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    table = [[1, 2], [3, 0]]

    def slots(seq: int, positions) -> list[int]:
        return [table[seq][p // BLOCK] * BLOCK + p % BLOCK for p in positions]

    g = torch.Generator().manual_seed(0)

    def qkv(n):
        return (torch.randn(n, HEADS, HEAD, generator=g).to(DTYPE),
                torch.randn(n, KV_HEADS, HEAD, generator=g).to(DTYPE),
                torch.randn(n, KV_HEADS, HEAD, generator=g).to(DTYPE))

    prefill = slots(0, range(40)) + slots(1, range(7))
    decode = slots(0, [40]) + slots(1, [7])
    steps = [  # (inputs, seq_lens, query_lens, upstream's slot mapping, ours, actual tokens)
        (qkv(47), [40, 7], [40, 7], prefill, prefill, 47),
        (qkv(3), [41, 8], [1, 1], decode + [-1], decode, 2),
    ]
    kv_ref = torch.zeros(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD, dtype=DTYPE)
    kv = kv_ref.clone()
    for (q, k, v), seq_lens, query_lens, ref_slots, our_slots, n in steps:
        md_ref = _metadata(cpu_attn, isa, seq_lens, query_lens, ref_slots, table, n)
        md = _metadata(cpu_attn, isa, seq_lens, query_lens, our_slots, table, n)
        out_ref = torch.zeros(q.shape[0], HEADS, HEAD, dtype=DTYPE)
        out = out_ref.clone()
        ref.do_kv_cache_update(layer, k, v, kv_ref, md_ref.slot_mapping)
        ref.forward(layer, q, k, v, kv_ref, md_ref, out_ref)
        assert fused.forward(layer, q, k, v, kv, md, out) is out
        assert torch.equal(kv, kv_ref)
        assert torch.equal(out[:n], out_ref[:n])
        assert out[:n].abs().sum() > 0
    assert kv.abs().sum() > 0 and kv[4:].abs().sum() == 0  # written where the table says only


def test_a_layer_sharing_another_layers_cache_does_not_write(cpu_attn, monkeypatch):
    from vllm_edge.attention.cpu_fused import FusedKVCPUAttentionImpl

    config = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=DTYPE))
    monkeypatch.setattr(cpu_attn, "get_current_vllm_config", lambda: config)
    fused = FusedKVCPUAttentionImpl(HEADS, HEAD, HEAD ** -0.5, KV_HEADS, None, None, "auto",
                                    kv_sharing_target_layer_name="model.layers.0.self_attn.attn")
    isa = _isa(cpu_attn)
    layer = types.SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    kv = torch.zeros(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD, dtype=DTYPE)
    q, k, v = (torch.ones(3, h, HEAD, dtype=DTYPE) for h in (HEADS, KV_HEADS, KV_HEADS))
    md = _metadata(cpu_attn, isa, [3], [3], [32, 33, 34], [[1]], 3)
    fused.forward(layer, q, k, v, kv, md, torch.zeros(3, HEADS, HEAD, dtype=DTYPE))
    assert kv.abs().sum() == 0


def test_warm_up_without_metadata_returns_the_output_untouched(impls):
    _, fused = impls
    out = torch.full((2, HEADS, HEAD), 7.0, dtype=DTYPE)
    assert fused.forward(None, out, None, None, torch.tensor([]), None, out) is out
    assert fused._kv_views is None  # the placeholder cache is never split
