"""`run` keeps a Triton without a CPU backend out of its process (runtime/triton_hide.py): torch
and vLLM import and take their no-Triton branch, and VLLM_EDGE_HIDE_TRITON=0 imports it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_edge.runtime import triton_hide

PROBE = """
import json, sys
from vllm_edge.runtime import triton_hide
state = triton_hide.hide()
import torch
import vllm
from vllm.triton_utils import HAS_TRITON
from torch.utils._triton import has_triton
print(json.dumps({"state": state, "loaded": sys.modules.get("triton") is not None,
                  "vllm_has_triton": HAS_TRITON, "torch_has_triton": has_triton(),
                  "again": triton_hide.hide()}))
"""


def probe(value: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VLLM_EDGE_HIDE_TRITON": value})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cpu_backend_is_found_by_its_directory(tmp_path):
    assert not triton_hide.cpu_backend([str(tmp_path)])
    (tmp_path / "backends" / "nvidia").mkdir(parents=True)
    assert not triton_hide.cpu_backend([str(tmp_path)])
    (tmp_path / "backends" / "cpu").mkdir()
    assert triton_hide.cpu_backend([str(tmp_path)])


def test_hidden_then_torch_and_vllm_import_without_it():
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or triton_hide.cpu_backend(list(spec.submodule_search_locations or [])):
        pytest.skip("this install has no Triton, or one with a CPU backend: nothing to hide")
    r = probe("1")
    assert r == {"state": "hidden", "loaded": False, "vllm_has_triton": False, "torch_has_triton": False,
                 "again": "hidden"}
    off = probe("0")
    assert off["state"] == "off" and off["loaded"] and off["vllm_has_triton"] is False
