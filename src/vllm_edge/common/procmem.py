"""Process-tree memory and timing from /proc.

Memory is RssAnon summed over the whole process tree. VmRSS counts page-cache
pages of the mmap'd checkpoint and vLLM keeps weights in a worker process, so
reading only our own VmRSS measures the wrong thing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from dataclasses import dataclass, field

# kcmp(2) tells whether two processes share one address space. A vfork()ed
# child (subprocess launches, compiler probes) shows its parent's RssAnon until
# it execs; summing both would count the same pages twice.
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True)


def same_address_space(pid_a: int, pid_b: int) -> bool | None:
    """True if both pids share one mm; None when the kernel cannot tell us."""
    if _SYS_KCMP is None:
        return None
    r = _libc.syscall(_SYS_KCMP, pid_a, pid_b, _KCMP_VM, 0, 0)
    if r < 0:
        return None
    return r == 0


def rss_anon_kb(pid: int) -> int | None:
    """RssAnon of one process in kB, or None when it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return 0  # kernel threads have no RssAnon line


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
    except (FileNotFoundError, ProcessLookupError):
        pass
    return kids


def _tree_with_parents(root_pid: int) -> list[tuple[int, int | None]]:
    seen: dict[int, int | None] = {}
    stack: list[tuple[int, int | None]] = [(root_pid, None)]
    while stack:
        pid, parent = stack.pop()
        if pid in seen:
            continue
        seen[pid] = parent
        stack.extend((kid, pid) for kid in _children(pid))
    return list(seen.items())


def process_tree(root_pid: int | None = None) -> list[int]:
    """The root and all of its descendants, rescanned on every call."""
    return [pid for pid, _ in _tree_with_parents(os.getpid() if root_pid is None else root_pid)]


def tree_rss_anon_kb(root_pid: int | None = None) -> list[tuple[int, int, bool]]:
    """(pid, RssAnon in kB, shared) for every live process of the tree; ``shared``: a child that
    still shares its parent's address space (vfork before exec), whose memory its parent
    already holds, so a sum counts it once by leaving it out."""
    rows = []
    for pid, parent in _tree_with_parents(os.getpid() if root_pid is None else root_pid):
        kb = rss_anon_kb(pid)
        if kb is None:
            continue
        rows.append((pid, kb, bool(parent is not None and same_address_space(pid, parent))))
    return rows


def tree_rss_anon_mb(root_pid: int | None = None) -> tuple[float, int]:
    """(RssAnon summed over the tree in MB, number of live processes), counted as
    :func:`tree_rss_anon_kb` says."""
    rows = tree_rss_anon_kb(root_pid)
    return sum(kb for _, kb, shared in rows if not shared) / 1024.0, len(rows)


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ("" once it has exited)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def tree_rss_anon_split(root_pid: int, apart: str) -> tuple[float, int, float, list[int]]:
    """(RssAnon of the whole tree in MB, live processes, RssAnon of the processes whose
    command line holds ``apart`` in MB, their pids). Counted as :func:`tree_rss_anon_mb`."""
    rows = tree_rss_anon_kb(root_pid)
    own = [(pid, kb) for pid, kb, shared in rows if not shared]
    part = [(pid, kb) for pid, kb in own if apart in cmdline(pid)]
    return (sum(kb for _, kb in own) / 1024.0, len(rows), sum(kb for _, kb in part) / 1024.0,
            [pid for pid, _ in part])


def process_start_epoch(pid: int | None = None) -> float:
    """When the kernel created the process (seconds since the epoch), so that
    interpreter start-up and imports count in a ready time."""
    pid = os.getpid() if pid is None else pid
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # Field 22 (starttime, clock ticks after boot); comm may contain spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    start_ticks = int(fields[19])
    # Age from /proc/uptime, not btime + ticks: btime is whole seconds, which put the start
    # up to a second early.
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    now = time.time()
    return now - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class TreeSampler:
    """Samples tree RssAnon every ``interval`` seconds in a daemon thread."""

    root_pid: int = field(default_factory=os.getpid)
    interval: float = 0.02
    peak_mb: float = 0.0
    peak_procs: int = 0
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    keep_samples: bool = False
    # a process that comes and goes by design (the gate's schema compiler, killed past its
    # budget) is a sawtooth in the tree's RssAnon, not a leak: kept apart, sample by sample
    apart: str | None = None
    apart_samples: list[float] = field(default_factory=list)
    apart_pids: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def sample(self) -> float:
        if self.apart is None:
            mb, n = tree_rss_anon_mb(self.root_pid)
        else:
            mb, n, part, pids = tree_rss_anon_split(self.root_pid, self.apart)
            if self.keep_samples:
                self.apart_samples.append(part)
            self.apart_pids.update(pids)
        if mb > self.peak_mb:
            self.peak_mb = mb
        self.peak_procs = max(self.peak_procs, n)
        if self.keep_samples:
            self.samples.append((time.time(), mb, n))
        return mb

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "TreeSampler":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
