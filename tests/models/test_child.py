"""Builds in a spawned child process (models/child.py): the result comes back, the child's
progress reaches this process's terminal, its errors come back named, and a child that dies
without a word is a clear error too."""

from __future__ import annotations

import os

import pytest

from vllm_edge.models import child
from vllm_edge.models.errors import ModelNotAvailable

T = "tests.support.child_targets"


def test_the_function_runs_in_another_process_and_its_output_reaches_the_terminal(capfd):
    pid = child.run(f"{T}:pid_and_progress", "probe", message="quantize 3/7 tensors")
    assert isinstance(pid, int) and pid != os.getpid()
    assert "quantize 3/7 tensors" in capfd.readouterr().err


def test_an_edge_error_comes_back_as_one_message():
    with pytest.raises(ModelNotAvailable, match=r"^preparing probe failed: no such tensor x; "
                                                r"nothing was cached$"):
        child.run(f"{T}:refuse", "probe", why="no such tensor x")


def test_a_bug_keeps_its_traceback_and_is_named(capfd):
    with pytest.raises(child.BuildFailed, match=r"preparing probe failed \(KeyError: "):
        child.run(f"{T}:crash", "probe")
    assert "Traceback" in capfd.readouterr().err


def test_a_child_that_dies_silently_is_an_error():
    with pytest.raises(child.BuildFailed, match=r"ended with exit code 7"):
        child.run(f"{T}:die", "probe", code=7)
