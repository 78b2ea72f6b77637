"""Tree RssAnon sees memory held by children, which VmRSS of ourselves cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from vllm_edge.common.procmem import (
    TreeSampler,
    process_start_epoch,
    process_tree,
    rss_anon_kb,
    tree_rss_anon_mb,
    tree_rss_anon_split,
)

CHILD = "import sys,time; b=bytearray(200*1024*1024); b[::4096]=b'x'*len(b[::4096]); print('ready',flush=True); time.sleep(30)"


def test_tree_includes_a_child_holding_200mb():
    base, n0 = tree_rss_anon_mb()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in process_tree()
        with_child, n1 = tree_rss_anon_mb()
        assert n1 == n0 + 1
        assert with_child - base > 180  # the child's 200 MB bytearray
        assert rss_anon_kb(child.pid) / 1024 > 180
        assert rss_anon_kb(os.getpid()) / 1024 < with_child - 180  # own RssAnon alone misses it
    finally:
        child.kill()
        child.wait()
    assert rss_anon_kb(child.pid) is None


def test_a_child_named_on_its_command_line_is_kept_apart():
    marker = "procmem-apart-marker"
    child = subprocess.Popen([sys.executable, "-c", CHILD, marker], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        total, n, part, pids = tree_rss_anon_split(os.getpid(), marker)
        assert pids == [child.pid] and 180 < part < total
        with TreeSampler(interval=10, keep_samples=True, apart=marker) as s:
            pass
        assert len(s.apart_samples) == len(s.samples) == 2 and min(s.apart_samples) > 180
        assert s.apart_pids == {child.pid}
    finally:
        child.kill()
        child.wait()
    assert tree_rss_anon_split(os.getpid(), marker)[2:] == (0.0, [])


def test_sampler_keeps_the_peak_after_the_child_exits():
    with TreeSampler(interval=0.01) as s:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        time.sleep(0.1)
        child.kill()
        child.wait()
    settled, _ = tree_rss_anon_mb()
    assert s.peak_mb - settled > 150
    assert s.peak_procs >= 2


def test_process_start_is_before_now_and_after_boot():
    start = process_start_epoch()
    assert time.time() - 3600 * 24 * 365 < start <= time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert process_start_epoch(child.pid) >= start
    finally:
        child.kill()
        child.wait()


def test_kcmp_tells_shared_from_separate_address_spaces():
    from vllm_edge.common.procmem import same_address_space

    me = os.getpid()
    assert same_address_space(me, me) is True
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.2)
        assert same_address_space(me, child.pid) is False
    finally:
        child.kill()
        child.wait()


def test_a_vfork_child_is_counted_once():
    """A clone(CLONE_VM) child shares our address space, as a vfork()ed child does until it
    execs. Its RssAnon equals ours; the tree sum must count those pages once."""
    import ctypes

    from vllm_edge.common import procmem

    libc = ctypes.CDLL(None, use_errno=True)
    stack = ctypes.create_string_buffer(1 << 16)
    CHILD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    pause = libc.pause

    @CHILD
    def body(_):
        pause()  # parks the shared-VM child without touching Python state
        return 0

    CLONE_VM, SIGCHLD = 0x100, 17
    top = ctypes.c_void_p(ctypes.addressof(stack) + len(stack))
    libc.clone.argtypes = [CHILD, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    pid = libc.clone(body, top, CLONE_VM | SIGCHLD, None)
    assert pid > 0
    try:
        time.sleep(0.2)
        assert procmem.same_address_space(os.getpid(), pid) is True
        mine = procmem.rss_anon_kb(os.getpid()) / 1024
        total, n = procmem.tree_rss_anon_mb()
        assert n >= 2
        assert total < mine * 1.5  # the shared child is not added again
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
