"""`bench profile` attribution on real torch.profiler traces of small torch programs (no engine)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from support.cli_runner import run_cli
from vllm_edge.bench import profile


def _trace(fn):
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        import time

        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    return prof, wall


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)  # "Norm" in the class name -> norm
        self.act = torch.nn.GELU()  # torch's own activation: not vLLM's, left unmarked

    def forward(self, x):
        return self.act(self.norm(x))


def test_module_group_rules_on_plain_torch_modules():
    assert profile.module_group(torch.nn.LayerNorm(8)) == "norm"
    assert profile.module_group(torch.nn.Linear(4, 4)) is None  # only vLLM's LinearBase
    assert profile.module_group(torch.nn.GELU()) is None


def test_module_group_on_vllm_classes():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.sample.sampler import Sampler

    with set_current_vllm_config(VllmConfig()):
        assert profile.module_group(SiluAndMul()) == "activation"
        assert profile.module_group(RMSNorm(8)) == "norm"
        assert profile.module_group(LogitsProcessor(100)) == "embed_head"
        assert profile.module_group(Sampler()) == "sampling"


def test_name_rules():
    assert profile.name_group("vllm::edge_cpu_int4_linear") == "linear"
    assert profile.name_group("edge_int4_dequant") == "linear"
    assert profile.name_group("vllm_edge::int4_gemv") == "linear"
    assert profile.name_group("edge_int4_product") == "linear"
    assert profile.name_group("aten::_weight_int4pack_mm_for_cpu") == "linear"
    assert profile.name_group("_C::onednn_mm") == "linear"
    assert profile.name_group("vllm::edge_cpu_int4_embedding") == "embed_head"
    assert profile.name_group("_C::cpu_attention_with_kv_cache") == "attention"
    assert profile.name_group("_C::rotary_embedding") == "attention"
    assert profile.name_group("aten::silu") == "activation"
    assert profile.name_group("aten::copy_") == "other"


def test_marks_attribute_ops_to_the_innermost_module_group():
    block = Block()
    handles, counts = profile.install_marks(block.modules())
    assert counts == {"norm": 1}
    x = torch.randn(32, 64)
    w = torch.randn(64, 64)

    def work():
        with record_function(profile.MARK_PREFIX + "embed_head"):
            torch.mm(x, w)  # a GEMM inside the head's range is the head's
        block(x)
        torch.mm(x, w)  # outside every range: the name rule makes it a linear
        x.add(1.0)  # outside, no rule: other

    prof, wall = _trace(work)
    for h in handles:
        h.remove()
    rec = profile.summarize_events(prof.events(), wall, top=50)
    groups = rec["groups"]
    assert rec["mark_events"] == 2  # the manual head range and the norm hook
    head_ops = {o["name"] for o in groups["embed_head"]["top_ops"]}
    assert "aten::mm" in head_ops
    assert "aten::layer_norm" in {o["name"] for o in groups["norm"]["top_ops"]} or \
        "aten::native_layer_norm" in {o["name"] for o in groups["norm"]["top_ops"]}
    assert "aten::gelu" in {o["name"] for o in groups["activation"]["top_ops"]}
    assert "aten::mm" in {o["name"] for o in groups["linear"]["top_ops"]}
    assert "aten::add" in {o["name"] for o in groups["other"]["top_ops"]}
    # every group plus the untraced rest covers the wall time (rounding aside)
    total = sum(v["self_ms"] for v in groups.values())
    assert total == pytest.approx(max(rec["wall_ms"], rec["traced_ms"]), rel=1e-3, abs=0.01)
    # ops are sorted by self time and carry their group
    mm = [r for r in rec["top_ops"] if r["name"] == "aten::mm"]
    assert mm and mm[0]["calls"] == 2
    # one name in two groups: both kept, the larger one named
    assert set(mm[0]["groups"]) == {"embed_head", "linear"}
    assert mm[0]["group"] == max(mm[0]["groups"], key=mm[0]["groups"].get)
    assert [r["self_ms"] for r in rec["top_ops"]] == sorted((r["self_ms"] for r in rec["top_ops"]), reverse=True)


def test_hooks_are_removable():
    block = Block()
    handles, _ = profile.install_marks(block.modules())
    for h in handles:
        h.remove()
    prof, wall = _trace(lambda: block(torch.randn(4, 64)))
    assert profile.summarize_events(prof.events(), wall, top=5)["mark_events"] == 0


def test_summarize_rejects_a_zero_wall_time():
    prof, _ = _trace(lambda: torch.randn(4))
    with pytest.raises(profile.ProfileError, match="wall time"):
        profile.summarize_events(prof.events(), 0.0, top=5)


def _fake_result(name: str, lin_pct: float) -> dict:
    groups = {g: {"self_ms": 1.0, "pct": 1.0, "top_ops": [{"name": "aten::x", "self_ms": 1.0}]}
              for g in (*profile.GROUPS, profile.UNTRACED)}
    groups["linear"]["pct"] = lin_pct
    phase = {"wall_ms": 100.0, "tokens": 8, "tokens_per_s": 80.0, "groups": groups,
             "top_ops": [{"name": "aten::mm", "calls": 3, "self_ms": 40.0, "pct": 40.0, "group": "linear"}]}
    return {"benchmark": "profile", "build": name, "phases": {"prefill": phase, "decode": phase}}


def test_tables_show_every_group_and_op():
    r = _fake_result("a", 40.0)
    text = profile.format_table(r)
    for g in (*profile.GROUPS, profile.UNTRACED):
        assert g in text
    assert "aten::mm" in text and "== decode" in text
    cmp = profile.format_comparison([r, _fake_result("b", 55.5)])
    line = next(ln for ln in cmp.splitlines() if ln.startswith("linear"))
    assert "40.0" in line and "55.5" in line


def test_load_names_the_file(tmp_path):
    bad = tmp_path / "speed.json"
    bad.write_text(json.dumps({"benchmark": "speed"}))
    with pytest.raises(profile.ProfileError, match="speed.json.*not a `bench profile` result"):
        profile.load(bad)


def test_cli_compare_and_bad_args(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_fake_result("bf16", 30.0)))
    b.write_text(json.dumps(_fake_result("int4", 45.0)))
    proc = run_cli("bench", "profile", "--compare", str(a), str(b), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "a" in proc.stdout.split() and "45.0" in proc.stdout  # default labels: the file stems
    proc = run_cli("bench", "profile", "--prompt-len", "0", timeout=120)
    assert proc.returncode == 2 and "--prompt-len must be at least 1" in proc.stderr
    proc = run_cli("bench", "profile", "--compare", str(a), str(b), "--labels", "x,y", timeout=120)
    assert proc.returncode == 0 and " x " in proc.stdout.splitlines()[2] + " "
    proc = run_cli("bench", "profile", "--compare", str(a), str(b), "--labels", "x", timeout=120)
    assert proc.returncode == 2 and "1 labels for 2 results" in proc.stderr
    proc = run_cli("bench", "profile", "--compare", str(tmp_path / "missing.json"), timeout=120)
    assert proc.returncode == 2 and "missing.json" in proc.stderr
