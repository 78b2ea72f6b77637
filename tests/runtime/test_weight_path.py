"""The weight-path choice on captured snapshots, and the VLLM_EDGE_HW_PROFILE override."""

from __future__ import annotations

import json

import pytest

from vllm_edge.common import hw
from vllm_edge.runtime import weight_path
from vllm_edge.runtime.weight_path import for_run, select_weight_path

from .test_hw import SNAPSHOTS, _write, _write_sysfs

ARCH = {"amx_xeon": "x86_64", "zen4": "x86_64", "arm64": "aarch64"}


@pytest.fixture
def snapshot(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_EDGE_HW_PROFILE", raising=False)

    def make(name):
        root = tmp_path / name
        if not root.exists():
            _write(root, *SNAPSHOTS[name])
        return hw.profile(root, arch=ARCH[name])

    return make


def test_amx_xeon_speed_is_cpu_int4_while_w4a8_is_unmeasured(snapshot):
    p = select_weight_path(snapshot("amx_xeon"), "speed")
    assert (p.name, p.scheme) == ("cpu_int4", "cpu_int4") and p.verified
    assert any("AMX" in r and "W4A8" in r for r in p.reasons)


def test_amx_without_bf16_is_w4a8(snapshot):
    p = select_weight_path({"arch": "x86_64", "isa": {"avx512": True, "amx_tile": True, "amx_int8": True}},
                           "speed")
    assert p.name == "gptq_w4a8" and p.scheme == "gptq"
    assert not p.verified  # no AMX machine measured it


def test_amx_xeon_fidelity_is_cpu_int4(snapshot):
    p = select_weight_path(snapshot("amx_xeon"), "fidelity")
    assert (p.name, p.scheme, p.group) == ("cpu_int4", "cpu_int4", 32)
    assert any("fidelity" in r for r in p.reasons)


def test_zen4_is_cpu_int4(snapshot):
    p = select_weight_path(snapshot("zen4"), "speed")
    assert p.name == "cpu_int4" and p.verified
    assert any("without AMX" in r for r in p.reasons)


def test_arm64_is_cpu_int4_unverified(snapshot):
    for priority in ("speed", "fidelity"):
        p = select_weight_path(snapshot("arm64"), priority)
        assert p.name == "cpu_int4" and not p.verified
        assert any("ARM64" in r for r in p.reasons)


def test_numa_is_mentioned(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_EDGE_HW_PROFILE", raising=False)
    _write(tmp_path, *SNAPSHOTS["amx_xeon"])
    _write_sysfs(tmp_path, nodes=2)
    p = select_weight_path(hw.profile(tmp_path, arch="x86_64"))
    assert any("2 NUMA nodes" in r for r in p.reasons)


def test_bad_priority():
    with pytest.raises(ValueError, match="priority"):
        select_weight_path({"arch": "x86_64", "isa": {}}, "fast")


def test_env_override_replaces_the_probe(tmp_path, monkeypatch):
    _write(tmp_path, *SNAPSHOTS["zen4"])
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps(
        {"arch": "x86_64", "model_name": "captured SPR", "isa": ["avx512f", "amx_tile", "amx_int8"]}))
    prof = hw.profile(tmp_path, arch="x86_64")
    assert prof.source == "VLLM_EDGE_HW_PROFILE" and prof.model_name == "captured SPR"
    assert prof.isa["avx512"] and prof.isa["amx_int8"] and not prof.isa["avx512_bf16"]
    assert prof.logical_cpus == 4  # omitted fields keep the probed values
    assert select_weight_path(prof).name == "gptq_w4a8"


def test_env_override_to_arm(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "aarch64", "isa": {"neon": True}}))
    prof = hw.profile()
    assert prof.isa == {"neon": True, "i8mm": False, "bf16": False, "sve": False, "dotprod": False}
    assert select_weight_path(prof).name == "cpu_int4"


@pytest.mark.parametrize("value, match", [
    ('["x86_64"]', "JSON object"),
    ('{"arch": "x86_64", "isa": ["amx"]}', "unknown isa flag"),
    ('{"cores": 4}', "unknown field"),
    ('{"arch": "aarch64"}', "gives no isa"),
    ("{not json", "invalid JSON"),
])
def test_env_override_errors(monkeypatch, value, match):
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", value)
    with pytest.raises(ValueError, match=match):
        hw.profile()


def test_run_falls_back_loudly_when_gptq_export_is_missing(monkeypatch):
    amx = {"arch": "x86_64", "isa": {"avx512": True, "amx_tile": True, "amx_int8": True}}
    monkeypatch.setattr(weight_path, "gptq_export_status", lambda: (False, "not implemented"))
    p = for_run(amx)
    assert p.name == "cpu_int4" and p.fallback_from == "gptq_w4a8"
    assert p.reasons[-1] == "falling back to cpu_int4: not implemented"


def test_run_bf16_is_explicit():
    p = for_run({"arch": "x86_64", "isa": {"avx512": True}}, dtype="bf16")
    assert p.name == "bf16" and p.scheme is None
    assert "--quant none" in p.reasons[0] and "cpu_int4" in p.reasons[0]
    with pytest.raises(ValueError, match="dtype"):
        for_run({"arch": "x86_64", "isa": {}}, dtype="fp8")


def test_doctor_renders_the_path():
    from vllm_edge import doctor

    path = for_run({"arch": "aarch64", "isa": {"neon": True}}).to_dict()
    report = {"versions": {}, "cpu": {"model": "m", "arch": "aarch64", "allowed_cpus": [0], "isa": {}},
              "patches": [], "registrations": [], "env": {}, "problems": [],
              "weight_path": {**path, "profile_source": "VLLM_EDGE_HW_PROFILE"}}
    text = doctor.render(report)
    assert "weight path for run: cpu_int4 (unverified) [from VLLM_EDGE_HW_PROFILE]" in text
    assert "ARM64" in text


def test_doctor_json_carries_the_path(monkeypatch):
    from vllm_edge import doctor

    monkeypatch.setattr(doctor, "torchvision_trap", lambda: [])
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps(
        {"arch": "x86_64", "isa": ["avx512", "amx_tile", "amx_int8"]}))
    monkeypatch.setattr(weight_path, "gptq_export_status", lambda: (False, "not implemented"))
    report = doctor.collect()
    wp = report["weight_path"]
    assert wp["name"] == "cpu_int4" and wp["fallback_from"] == "gptq_w4a8"
    assert wp["profile_source"] == "VLLM_EDGE_HW_PROFILE"
    json.dumps(report)
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", "[1]")
    report = doctor.collect()
    assert report["weight_path"] is None and any("VLLM_EDGE_HW_PROFILE" in p for p in report["problems"])


def test_amx_runs_the_gptq_export_when_it_exists():
    ok, _ = weight_path.gptq_export_status()
    assert ok  # `vllm-edge quantize --quant gptq` exists
    p = for_run({"arch": "x86_64", "isa": {"avx512": True, "amx_tile": True, "amx_int8": True}})
    assert (p.name, p.scheme, p.group, p.fallback_from) == ("gptq_w4a8", "gptq", 64, None)


@pytest.mark.parametrize("name", sorted(ARCH))
def test_reasons_quote_no_copied_figure(snapshot, name):
    # `run` and `doctor` print these: a figure here would go stale with the kernel
    # (figures live in benchmarks/results/ and the generated docs).
    import re

    figure = re.compile(r"\d(?:\.\d+)?\s?(?:x|×|tok/s|MB\b|ms\b|µs\b|GB/s)(?![\d\w])")
    for priority in ("speed", "fidelity"):
        for reason in select_weight_path(snapshot(name), priority).reasons:
            assert not figure.search(reason), reason


def test_avx2_runs_the_32_row_product_and_is_measured(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": ["avx2"]}))
    p = select_weight_path(hw.profile())
    assert p.name == "cpu_int4" and p.verified
    assert any("int4_gemv32.c" in r for r in p.reasons)
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": []}))
    p = select_weight_path(hw.profile())
    assert not p.verified and any("tinygemm" in r for r in p.reasons)


def test_avx512_reasons_name_the_kernel_that_runs(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": ["avx512", "avx512_bf16"]}))
    assert any("native product" in r for r in select_weight_path(hw.profile()).reasons)
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": ["avx512"]}))
    assert any("tinygemm" in r for r in select_weight_path(hw.profile()).reasons)
