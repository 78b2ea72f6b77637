"""The remembered Inductor ISA probe, in fresh interpreters (each process probes once): the
first start probes as Inductor does and records it; the next one reuses a record that says
every advertised ISA passed and gets the same ISA list; anything else changes nothing."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 probe")

CODE = """
import json
from torch._inductor import cpu_vec_isa
# counts the dlopen subprocesses Inductor's checks start (the real ones still run)
loads = []
_probe_load = cpu_vec_isa.VecISA._probe_load
def counted(self, output_path):
    loads.append(str(self))
    return _probe_load(self, output_path)
cpu_vec_isa.VecISA._probe_load = counted
from vllm_edge.runtime import isa_probe
state = isa_probe.apply()
from torch._inductor import config
print(json.dumps({"state": state, "vec_isa_ok": config.cpp.vec_isa_ok,
                  "valid": [str(i) for i in cpu_vec_isa.valid_vec_isa_list()], "loads": loads}))
"""


def _start(home, keep_loads=False, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_VEC_ISA_OK",)}
    e.update(VLLM_EDGE_HOME=str(home), **env)
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=e, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not keep_loads:
        result.pop("loads")
    return result


def _record(home):
    [path] = list((home / "isa_probe").glob("*.json"))
    return path, json.loads(path.read_text())


def test_probed_once_then_remembered_with_the_same_isa_list(tmp_path):
    first = _start(tmp_path)
    path, rec = _record(tmp_path)
    assert rec["passed"] == first["valid"] and rec["what"]["torch"]
    if not rec["all_passed"]:
        pytest.skip(f"an advertised ISA failed Inductor's probe here: {rec}")
    assert first["state"] == "recorded" and first["vec_isa_ok"] is True
    second = _start(tmp_path)
    assert second == {"state": "remembered", "vec_isa_ok": True, "valid": first["valid"]}

    # a record from another torch, compiler or CPU is probed again, not trusted
    rec["what"]["torch"] = "0.0"
    path.write_text(json.dumps(rec))
    assert _start(tmp_path)["state"] == "recorded"
    assert _record(tmp_path)[1]["what"]["torch"] != "0.0"


def test_the_extra_isa_checks_are_answered_from_the_record(tmp_path):
    """Inductor's BF16, VNNI and AMX checks run on top of the base probe; once each has passed
    in one process, the next process starts no dlopen subprocess for any of them."""
    first = _start(tmp_path, keep_loads=True)
    path, rec = _record(tmp_path)
    if not rec["all_passed"]:
        pytest.skip(f"an advertised ISA failed Inductor's probe here: {rec}")
    # every check that passed is kept: the base probe's one per ISA and the extra ones
    assert len(rec["checks"]) == len(first["loads"]) and all(v is True for v in rec["checks"].values())
    extra = len(first["loads"]) - len(rec["advertised"])
    second = _start(tmp_path, keep_loads=True)
    assert second["state"] == "remembered" and second["valid"] == first["valid"]
    assert second["loads"] == []

    # a pass that is not in the record is checked again
    if extra:
        rec["checks"] = {}
        path.write_text(json.dumps(rec))
        third = _start(tmp_path, keep_loads=True)
        assert len(third["loads"]) == extra and third["valid"] == first["valid"]
        assert len(_record(tmp_path)[1]["checks"]) == extra


def test_a_failed_probe_changes_nothing(tmp_path):
    _start(tmp_path)
    path, rec = _record(tmp_path)
    rec["all_passed"] = False
    path.write_text(json.dumps(rec))
    again = _start(tmp_path)
    assert again["state"] in ("recorded", "failed-isa")  # probed again, never trusted
    assert again["valid"] == rec["passed"]


def test_the_users_switch_and_ours_are_left_alone(tmp_path):
    assert _start(tmp_path, TORCHINDUCTOR_VEC_ISA_OK="0") == {"state": "user-set", "vec_isa_ok": False,
                                                              "valid": []}
    off = _start(tmp_path, VLLM_EDGE_ISA_PROBE_CACHE="0")
    assert off["state"] == "off" and off["vec_isa_ok"] is None
    assert not (tmp_path / "isa_probe").exists()
