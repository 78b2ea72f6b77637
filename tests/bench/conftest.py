"""Fake arms: tiny scripts whose output the harness judges; no engine starts here."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

FAKE_ARM = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    name, values_json, state = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    values = json.loads(values_json)
    counter = state / f"{name}.count"
    i = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(i + 1))
    root = Path(os.environ["VLLM_CACHE_ROOT"])
    marker = root / "compiled.marker"
    warm = marker.exists()
    marker.write_text(name)
    with open(state / "order.log", "a") as f:
        f.write(json.dumps({"arm": name, "cache_root": str(root), "warm": warm}) + "\\n")
    v = values[i % len(values)]
    if v == "fail":
        print("partial output", flush=True)
        sys.stderr.write("Traceback: something broke in " + name + "\\n")
        sys.exit(3)
    if v == "nojson":
        print("no json here")
        sys.exit(0)
    print("log line {not json")
    print(json.dumps(v))
''')


@pytest.fixture
def fake_arm(tmp_path: Path):
    """Returns make(name, values) -> arm dict; values[i] is printed on the arm's i-th run."""
    script = tmp_path / "fake_arm.py"
    script.write_text(FAKE_ARM)
    state = tmp_path / "state"
    state.mkdir()

    def make(name: str, values: list, env: dict | None = None) -> dict:
        return {"name": name, "cmd": [sys.executable, str(script), name, json.dumps(values), str(state)],
                "env": env or {}}

    make.state = state
    make.log = lambda: order_log(state)
    return make


def order_log(state: Path) -> list[dict]:
    p = state / "order.log"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture
def quiet_sampler():
    return lambda cores, seconds: {c: 0.0 for c in cores}


@pytest.fixture
def grid_kwargs(tmp_path: Path, quiet_sampler):
    return {"out_dir": tmp_path / "out", "work_dir": tmp_path / "work",
            "lock_path": tmp_path / "bench.lock", "sampler": quiet_sampler,
            "log": lambda msg: None}
