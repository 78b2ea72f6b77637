"""SIGKILL a real quantize at random points: the destination is always the previous
complete build or the new complete one, never a broken one, and the next run cleans up."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_edge.common import manifest

QUANTIZE = ("import sys; from vllm_edge.quant.quantize import quantize_model; "
            "quantize_model(sys.argv[1], sys.argv[2], progress=False)")


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory, default_model_dir) -> Path:
    from vllm_edge.models import synthetic

    out = tmp_path_factory.mktemp("tiny") / "llama"
    shape = synthetic.Shape.derive(256, 2, 49152)
    return synthetic.build(out, shape, tokenizer_from=default_model_dir, progress=False)


def _quantize(src: Path, dst: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", QUANTIZE, str(src), str(dst)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _settled(dst: Path) -> str:
    """The state a reader sees: 'absent' or 'complete'; anything else fails."""
    if not dst.exists():
        return "absent"
    why = manifest.problem(dst)
    assert why is None, f"a broken build is visible at the destination: {why}"
    return "complete"


def test_kill_anywhere_never_leaves_a_broken_build(tiny_src, tmp_path):
    dst = tmp_path / "q"
    t0 = time.monotonic()
    first = _quantize(tiny_src, dst)
    assert first.wait(120) == 0, first.stderr.read().decode()
    full = time.monotonic() - t0
    assert _settled(dst) == "complete"
    rng = random.Random(1234)
    for _ in range(5):
        proc = _quantize(tiny_src, dst)
        time.sleep(rng.uniform(0.05, full))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert _settled(dst) == "complete"  # the old build, or the new one if the kill came late
    last = _quantize(tiny_src, dst)
    assert last.wait(120) == 0, last.stderr.read().decode()
    assert _settled(dst) == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".q.lock", "q"], "litter left beside the build"
