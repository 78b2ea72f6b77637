"""The startup timeline: off unless asked, timed wrappers that keep behaviour, one line per
phase per process, and every vLLM/transformers target present in the pinned versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from vllm_edge.common import timeline


class Base:
    @classmethod
    def make(cls, x):
        return (cls.__name__, x)

    def step(self, x):
        return x + 1


class Child(Base):
    pass


@pytest.fixture
def tl(tmp_path, monkeypatch):
    f = tmp_path / "tl.jsonl"
    monkeypatch.setenv("VLLM_EDGE_TIMELINE", str(f))
    return f


def test_wrapped_calls_keep_their_result_and_are_recorded(tl, monkeypatch):
    mod = types.ModuleType("fake_target_mod")
    mod.Base, mod.Child = Base, Child

    def boom():
        raise KeyError("kept")

    mod.boom = boom
    monkeypatch.setitem(sys.modules, "fake_target_mod", mod)
    monkeypatch.setattr(Base, "make", Base.__dict__["make"])
    monkeypatch.setattr(Child, "step", Base.step, raising=False)
    assert timeline.wrap("make", "fake_target_mod:Base.make")
    assert timeline.wrap("make", "fake_target_mod:Base.make")  # idempotent: one wrapper
    assert timeline.wrap("step", "fake_target_mod:Child.step")  # inherited: wrapped on Child
    assert timeline.wrap("boom", "fake_target_mod:boom")
    assert not timeline.wrap("x", "fake_target_mod:Base.nope")
    assert not timeline.wrap("x", "no_such_module_xyz:f")
    assert Child.make(3) == ("Child", 3)  # still a classmethod, bound to the subclass
    assert Child().step(1) == 2 and Base().step(1) == 2
    with pytest.raises(KeyError, match="kept"):
        mod.boom()
    recs = timeline.read(tl)
    assert [r["name"] for r in recs] == ["make", "step", "boom"]  # Base.step was not wrapped
    assert all(r["pid"] == os.getpid() and r["end"] >= r["start"] and r["rss_anon_kb"] > 0 for r in recs)
    monkeypatch.setattr(Child, "step", Base.step)


def test_off_by_default_nothing_is_written_or_wrapped(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_EDGE_TIMELINE", raising=False)
    with timeline.phase("x"):
        pass
    timeline.record("y", 0, 1)
    assert timeline.install() == []
    assert not list(tmp_path.iterdir())


def test_every_target_exists_in_the_pinned_versions(tmp_path):
    """In a fresh interpreter (the wrappers must not leak into this one)."""
    code = ("import json; from vllm_edge.common import timeline; "
            "print(json.dumps(timeline.install()))")
    env = dict(os.environ, VLLM_EDGE_TIMELINE=str(tmp_path / "t.jsonl"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
