"""The ledger's attribution on plain torch modules: dedup, roles, ties, residency."""

from __future__ import annotations

import torch

from vllm_edge.bench.ledger import anon_mappings, ledger, resident_bytes


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(1000, 256)
        self.proj = torch.nn.Linear(256, 256, bias=False)
        self.lm_head = torch.nn.Linear(256, 1000, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied
        self.register_buffer("packed", torch.zeros(256, 64, dtype=torch.uint8))


def test_tied_storage_counted_once_and_shown_as_tied():
    led = ledger(Tiny())
    emb_mb = 1000 * 256 * 4 / 2**20
    assert abs(led["roles"]["embedding/head"]["allocated_mb"] - round(emb_mb, 1)) <= 0.1
    assert led["roles"]["embedding/head"]["storages"] == 1
    assert abs(led["tied_mb"] - round(emb_mb, 1)) <= 0.1
    assert led["roles"]["other weights"]["storages"] == 1
    assert led["roles"]["buffers"]["storages"] == 1
    names = [t["names"] for t in led["largest_tensors"]]
    assert ["embed_tokens.weight", "lm_head.weight"] in names


def _fresh_pages(n: int) -> torch.Tensor:
    # A new anonymous mapping: never touched. torch.empty may hand back heap pages an earlier
    # test already faulted in (glibc raises its mmap threshold after large frees).
    import mmap

    return torch.frombuffer(mmap.mmap(-1, n), dtype=torch.uint8)


def test_mincore_tells_untouched_from_touched():
    t = _fresh_pages(64 * 2**20)
    before = resident_bytes(t.data_ptr(), t.numel())
    t.fill_(1)
    after = resident_bytes(t.data_ptr(), t.numel())
    assert before < 8 * 2**20
    assert after == t.numel()


def test_kv_cache_allocated_vs_resident_and_unattributed():
    kv = [_fresh_pages(32 * 2**20), _fresh_pages(32 * 2**20)]
    kv[0].fill_(0)
    led = ledger(Tiny(), kv)
    assert led["kv_cache"]["allocated_mb"] == 64.0
    assert 31 <= led["kv_cache"]["resident_mb"] <= 33
    assert led["unattributed_mb"] == round(led["rss_anon_mb"] - led["attributed_mb"], 1) or \
        abs(led["unattributed_mb"] - (led["rss_anon_mb"] - led["attributed_mb"])) <= 0.2


def test_anon_mappings_sum_to_roughly_rss_anon():
    m = anon_mappings()
    assert m["mappings"] > 0 and m["total_anon_mb"] > 0 and m["largest"][0]["anon_mb"] >= 0


def test_cpu_int4_workspace_is_attributed(monkeypatch):
    """The multi-row dequantization buffer is process state, not a parameter: the ledger
    names it instead of leaving it unattributed."""
    from vllm_edge.quant import native

    ws = torch.ones(3 << 20, dtype=torch.bfloat16)  # 6 MiB, touched
    monkeypatch.setattr(native, "_workspace", ws)
    led = ledger(Tiny())
    assert led["roles"]["workspace"]["storages"] == 1
    assert abs(led["roles"]["workspace"]["resident_mb"] - 6.0) <= 0.1
    monkeypatch.setattr(native, "_workspace", None)
    assert "workspace" not in ledger(Tiny())["roles"]
