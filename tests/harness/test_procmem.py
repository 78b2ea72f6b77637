"""Tree RssAnon sees memory held by children, which VmRSS of ourselves cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from vllm_edge.harness.procmem import TreeSampler, process_start_epoch, process_tree, rss_anon_kb, tree_rss_anon_mb

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
