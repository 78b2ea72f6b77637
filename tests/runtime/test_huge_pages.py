"""The weights' memory collapsed into 2 MB pages in place: values kept, RssAnon not grown, and
the pages the kernel reports as AnonHugePages are the weights' own."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_edge.runtime import huge_pages as hp

MB = 1 << 20


def _vma_kb(addr: int) -> dict[str, int]:
    """Rss and AnonHugePages (kB) of the mapping that holds ``addr`` (this process): the
    mapping's own, so other threads' allocations elsewhere do not move them."""
    inside, out = False, {}
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head in ("Rss:", "AnonHugePages:"):
                out[head[:-1]] = int(line.split()[1])
    return out


def test_merge_joins_ranges_closer_than_a_page_only():
    assert hp.merge([(0, 100), (150, 300), (300 + hp.MERGE_GAP + 1, 9000)]) == [(0, 300), (4397, 9000)]
    assert hp.merge([(10, 50), (0, 20)]) == [(0, 50)]


def test_interior_is_the_aligned_part_or_nothing():
    assert hp.interior(1, 3 * hp.HUGE + 5) == (hp.HUGE, 3 * hp.HUGE)
    assert hp.interior(hp.HUGE + 1, 2 * hp.HUGE + 7) is None
    assert hp.interior(0, hp.HUGE) == (0, hp.HUGE)


@dataclasses.dataclass
class _Packed:
    codes: torch.Tensor
    scales: torch.Tensor


def test_weight_ranges_see_parameters_buffers_and_packed_attributes_once():
    m = torch.nn.Module()
    w = torch.nn.Parameter(torch.zeros(1000, 100), requires_grad=False)
    m.register_parameter("w", w)
    m.tied = w  # a second name for the same storage, as a tied head is
    m.register_buffer("b", torch.zeros(50))
    child = torch.nn.Module()
    child.packed = _Packed(torch.zeros(300, dtype=torch.uint8), torch.zeros(30))
    child.parts = [torch.zeros(7)]
    m.child = child
    starts = [s for s, _ in hp.weight_ranges(m)]
    expect = {t.untyped_storage().data_ptr() for t in (w, m.b, child.packed.codes,
                                                       child.packed.scales, child.parts[0])}
    assert sorted(starts) == sorted(expect)


def test_collapse_makes_the_weights_huge_pages_in_place():
    n = 40 * MB  # above glibc's largest mmap threshold: a mapping of its own
    m = torch.nn.Module()
    m.register_buffer("w", torch.randint(0, 255, (n,), dtype=torch.uint8))
    want = m.w.clone()
    ptr = m.w.data_ptr()
    before = _vma_kb(ptr)
    rep = hp.collapse_ranges(hp.weight_ranges(m))
    if rep.state == "unsupported":
        pytest.skip(f"this kernel cannot collapse anonymous memory: {rep.errors}")
    if set(rep.errors) & {"EAGAIN", "ENOMEM"}:
        pytest.skip(f"the kernel had no free huge page for some of it: {rep.to_dict()}")
    after = _vma_kb(ptr)
    assert rep.weight_bytes == n
    # all but the unaligned ends (at most 2 MB each side)
    assert rep.collapsed_bytes >= n - 4 * MB, rep.to_dict()
    grown = after["AnonHugePages"] - before.get("AnonHugePages", 0)
    assert grown * 1024 >= rep.collapsed_bytes, (before, after, rep.to_dict())
    assert m.w.data_ptr() == ptr and torch.equal(m.w, want)  # nothing moved, nothing changed
    assert after["Rss"] <= before["Rss"] + 4, (before, after)  # no page that was not resident


def test_apply_reports_and_never_raises():
    class Broken:
        def modules(self):
            raise RuntimeError("no modules")

    rep = hp.apply(Broken())
    assert rep.state == "unsupported" and rep.errors == {"RuntimeError": 1}
    assert hp.history[-1] is rep
