"""The model's weights in 2 MB pages, once they are loaded (and packed).

Batch-1 decode streams every weight once a step. vLLM keeps them in ordinary heap memory, and on
a Linux whose transparent huge pages are ``madvise`` (the default of most distributions) that
is 4 KB pages: a 1B model's 550 MB is 140,000 pages, each a TLB miss on the way through, and
the CPU's stream prefetchers stop at every 4 KB boundary. llama.cpp reads the same bytes from
its mmap of the file, which the page cache can hold in large folios. ``MADV_COLLAPSE`` (Linux
6.1) turns resident 4 KB pages into huge pages in place, synchronously and whatever the sysfs
setting, so no tensor moves and nothing that holds a pointer to a weight notices.

Only the 2 MB-aligned interior of memory the weights cover is collapsed, so no page that was
not already resident becomes so: RssAnon does not grow. Weights smaller than 2 MB are covered
where the allocator put them next to each other (ranges merged across gaps under one page,
which hold only allocator headers). Where the kernel cannot (older than 6.1, THP ``never``, no
free huge page) the weights stay as they were and the report says why.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

logger = logging.getLogger("vllm_edge.runtime.huge_pages")

HUGE = 2 << 20
# allocations closer than this are one range: the gap holds allocator headers, never a whole
# page that a trim could have returned to the OS
MERGE_GAP = 4096
MADV_COLLAPSE = 25

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


@dataclass
class Collapse:
    state: str  # "collapsed", "partial", "unsupported", "none"
    weight_bytes: int = 0
    collapsed_bytes: int = 0
    ranges: int = 0
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        return self.collapsed_bytes / self.weight_bytes if self.weight_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "share": round(self.share, 4)}


history: list[Collapse] = []


def _tensor_values(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensor_values(getattr(value, f.name))
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor) or dataclasses.is_dataclass(v):
                yield from _tensor_values(v)


def weight_ranges(model: Any) -> list[tuple[int, int]]:
    """(start, end) of every CPU storage the model's parameters, buffers and tensor attributes
    (packed layouts kept beside the parameters) live in, each storage once, sorted."""
    seen: dict[int, int] = {}
    for mod in model.modules():
        values = [*mod._parameters.values(), *mod._buffers.values(), *vars(mod).values()]
        for v in values:
            for t in _tensor_values(v):
                if t.device.type != "cpu" or t.is_meta:
                    continue
                st = t.untyped_storage()
                start, n = st.data_ptr(), st.nbytes()
                if start and n:
                    seen[start] = max(seen.get(start, 0), n)
    return sorted((s, s + n) for s, n in seen.items())


def merge(ranges: list[tuple[int, int]], gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def interior(start: int, end: int, page: int = HUGE) -> tuple[int, int] | None:
    """The page-aligned part of [start, end), or None when it holds no whole page."""
    s, e = -(-start // page) * page, end // page * page
    return (s, e) if e > s else None


def collapse_ranges(ranges: list[tuple[int, int]]) -> Collapse:
    merged = merge(ranges)
    rep = Collapse("none", weight_bytes=sum(e - s for s, e in ranges))
    t0 = time.perf_counter()
    for s, e in merged:
        inner = interior(s, e)
        if inner is None:
            continue
        a, b = inner
        rep.ranges += 1
        # one call per 2 MB page: a page the kernel cannot collapse (no free huge page) does
        # not cost the rest of the range
        for p in range(a, b, HUGE):
            if _libc.madvise(p, HUGE, MADV_COLLAPSE) == 0:
                rep.collapsed_bytes += HUGE
                continue
            err = ctypes.get_errno()
            name = errno.errorcode.get(err, str(err))
            rep.errors[name] = rep.errors.get(name, 0) + 1
            if err == errno.EINVAL:  # no MADV_COLLAPSE, THP "never", or not anonymous memory
                break
    rep.seconds = round(time.perf_counter() - t0, 3)
    if rep.errors and not rep.collapsed_bytes:
        rep.state = "unsupported" if set(rep.errors) == {"EINVAL"} else "partial"
    else:
        rep.state = "partial" if rep.errors else ("collapsed" if rep.collapsed_bytes else "none")
    return rep


def apply(model: Any) -> Collapse:
    """Collapse the loaded model's weights into huge pages (this process); never raises."""
    try:
        rep = collapse_ranges(weight_ranges(model))
    except Exception as exc:  # a speed lever must never stop a model from loading
        rep = Collapse("unsupported", errors={type(exc).__name__: 1})
    history.append(rep)
    logger.info("weights in huge pages (%s, pid %d): %.0f of %.0f MB in %d ranges, %.2f s%s",
                rep.state, os.getpid(), rep.collapsed_bytes / 2**20, rep.weight_bytes / 2**20,
                rep.ranges, rep.seconds, f", errors {rep.errors}" if rep.errors else "")
    return rep
