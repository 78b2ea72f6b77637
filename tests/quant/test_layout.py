"""The packed layout of _convert_weight_to_int4pack_for_cpu, measured (not assumed)."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.quant import pack


@pytest.mark.parametrize("n,k", [(64, 32), (128, 16), (112, 64), (48, 32), (16, 8), (576, 8)])
def test_probe_matches_closed_form(n, k):
    rows, cols = pack.probe_layout(n, k)
    exp_rows, exp_cols = pack.closed_form_source(n, k)
    assert torch.equal(rows, exp_rows) and torch.equal(cols, exp_cols)


def test_full_block_interleaves_rows_j_and_j_plus_half_a_block():
    """Blocks of 64 rows with AVX-512, 32 with AVX2: torch packs for the CPU it runs on."""
    b = pack.block_n()
    assert b == (64 if "avx512f" in _flags() else 32)
    h = b // 2
    rows, cols = pack.probe_layout(64, 4)
    # first byte: row 0 low nibble, row B/2 high nibble, both column 0
    assert rows[:4].tolist() == [0, h, 1, h + 1]
    # one column of a block is B/2 bytes, B nibbles
    assert cols[:b].eq(0).all() and cols[b:2 * b].eq(1).all()


def _flags() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line for line in f if line.startswith("flags")), "")


def test_layout_matches_is_true_on_this_torch():
    assert pack.layout_matches()


def test_rows_must_be_multiple_of_16():
    with pytest.raises(RuntimeError, match="16"):
        torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.zeros(40, 32, dtype=torch.int32), 1)
    assert pack.supports(40, 32, 32)[0] is False


@pytest.mark.parametrize("n,k,block", [(576, 128, 64), (1536, 64, 1024), (112, 64, 64), (48, 32, 64)])
def test_in_place_block_repack_equals_whole_tensor_pack(n, k, block):
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    p = pack.pack_nibbles(q)
    ptr = p.data_ptr()
    pack.repack_(p, block_rows=block)
    assert p.data_ptr() == ptr  # in place: no second resident copy
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    assert torch.equal(p, whole)
    assert torch.equal(pack.unpack_packed(p, k), q)
