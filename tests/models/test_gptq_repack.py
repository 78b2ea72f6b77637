"""GPTQ checkpoint -> cpu_int4 repack, end to end: our own `quantize --quant gptq` export of a
tiny synthetic Llama is repacked, and every repacked linear dequantizes to the GPTQ value
(computed here from the format definition) within the bound; the writer's refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from support.cli_runner import run_cli
from vllm_edge.common import manifest
from vllm_edge.common.atomic import DestinationError
from vllm_edge.models import synthetic
from vllm_edge.models.gptq_repack import REPORT_NAME, GptqSourceError, repack_gptq
from vllm_edge.quant import gptq_repack, pack
from vllm_edge.quant.gptq_repack import GptqRepackError
from vllm_edge.quant.quantize import quantize_model


def _llama(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir(exist_ok=True)
    (tok / "tokenizer.json").write_text("{}")
    shape = synthetic.Shape.derive(128, 1, 512, intermediate=256, heads=2, kv_heads=1)
    return synthetic.build(tmp_path / "bf16", shape, tokenizer_from=tok, progress=False)


def gptq_value(w: dict, base: str, group: int) -> torch.Tensor:
    """GPTQ v1 from its definition: w[n, k] = scale[k // g, n] * (q[n, k] - (stored zero + 1))."""
    qw, qz, sc = w[f"{base}.qweight"].to(torch.int64), w[f"{base}.qzeros"].to(torch.int64), w[f"{base}.scales"]
    k, n = qw.shape[0] * 8, qw.shape[1]
    q = torch.empty(n, k, dtype=torch.float64)
    zero = torch.empty(qz.shape[0], n, dtype=torch.float64)
    for j in range(8):
        q[:, j::8] = ((qw >> (4 * j)) & 0xF).t().double()
        zero[:, j::8] = ((qz >> (4 * j)) & 0xF).double() + 1
    cols = torch.arange(k) // group
    return sc.double()[cols].t() * (q - zero[cols].t())


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return _llama(tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module", params=[32, 64, 128])
def exported(request, bf16, tmp_path_factory):
    return quantize_model(bf16, tmp_path_factory.mktemp("gptq") / f"g{request.param}", "gptq",
                          request.param, progress=False), request.param


@pytest.fixture(scope="module")
def g64(bf16, tmp_path_factory):
    """One export for the refusals and the CLI."""
    return quantize_model(bf16, tmp_path_factory.mktemp("gptq") / "g64", "gptq", 64, progress=False)


def test_every_linear_repacks_within_the_bound(exported, tmp_path):
    src, group = exported
    out = repack_gptq(src, tmp_path / "rp", progress=False)
    g = load_file(str(src / "model.safetensors"))
    w = load_file(str(out / "model.safetensors"))
    bases = sorted(n[: -len(".qweight")] for n in g if n.endswith(".qweight"))
    assert "lm_head" in bases and any("mlp.down_proj" in b for b in bases) and len(bases) == 8
    report = json.loads((out / REPORT_NAME).read_text())
    assert {e["name"] for e in report["tensors"]} == {f"{b}.weight" for b in bases}
    for base in bases:
        assert f"{base}.qweight" not in w
        ref = gptq_value(g, base, group)
        ours = pack.dequantize_plain(w[f"{base}.weight_packed"], w[f"{base}.weight_scale"],
                                     w[f"{base}.weight_zero"], group).double()
        k = ref.shape[1]
        codes = pack.unpack_nibbles(w[f"{base}.weight_packed"]).double() - 8
        lim = gptq_repack.EPS * (codes.abs() * pack.expand_groups(w[f"{base}.weight_scale"].double().abs(),
                                                                    group, k)
                                 + pack.expand_groups(w[f"{base}.weight_zero"].double().abs(), group, k))
        assert ((ours - ref).abs() <= lim).all(), base
        # our exporter stores bf16-valued scales and zero 8: the repack is exact
        assert torch.equal(ours, ref), base
    # everything that was not a GPTQ linear is carried as stored
    for name, t in g.items():
        if not any(name.startswith(b + ".") for b in bases):
            assert torch.equal(w[name], t), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "cpu_int4"
    assert cfg["quantization_config"]["group_size"] == group
    assert cfg["quantization_config"]["quantize_embedding"] is False
    assert report["max_error_over_bound"] == 0 and report["split"] is False
    m = manifest.read(out)
    assert m["converter"] == "gptq-repack/1" and m["gptq_group_size"] == group
    assert manifest.problem(out) is None and (out / "tokenizer.json").is_file()
    assert not (out / "quantize_config.json").exists()


def _rewrite(src, tmp_path, edit_tensors=None, edit_qc=None):
    """A copy of ``src`` with its tensors and/or quantization settings edited."""
    import shutil

    dst = tmp_path / "edited"
    shutil.copytree(src, dst)
    if edit_tensors:
        t = load_file(str(dst / "model.safetensors"))
        edit_tensors(t)
        save_file(t, str(dst / "model.safetensors"))
    if edit_qc:
        cfg = json.loads((dst / "config.json").read_text())
        edit_qc(cfg["quantization_config"])
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_act_order_is_refused_naming_the_tensor(exported, tmp_path):
    src, group = exported
    name = "model.layers.0.mlp.down_proj"  # K = 256: two groups even at 128

    def permute(t):
        t[f"{name}.g_idx"] = t[f"{name}.g_idx"].flip(0).contiguous()

    with pytest.raises(GptqRepackError, match=f"tensor {name}: g_idx is an act-order"):
        repack_gptq(_rewrite(src, tmp_path, permute), tmp_path / "rp", progress=False)
    assert not (tmp_path / "rp").exists()


def test_source_refusals(g64, tmp_path):
    src = g64
    with pytest.raises(GptqSourceError, match="bits=8; cpu_int4 holds 4-bit codes only"):
        repack_gptq(_rewrite(src, tmp_path, edit_qc=lambda q: q.update(bits=8)), tmp_path / "a",
                    progress=False)
    with pytest.raises(GptqSourceError, match="checkpoint_format='marlin'"):
        repack_gptq(_rewrite(src, tmp_path / "b", edit_qc=lambda q: q.update(checkpoint_format="marlin")),
                    tmp_path / "a", progress=False)
    with pytest.raises(GptqSourceError, match="dynamic"):
        repack_gptq(_rewrite(src, tmp_path / "c", edit_qc=lambda q: q.update(dynamic={"-:.*": {}})),
                    tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()


def test_sym_with_v2_zeros_is_refused(g64, tmp_path):
    """Our export is v1 (zero - 1 stored): read as gptq_v2 its zeros are 7, not sym's 8."""
    src = _rewrite(g64, tmp_path, edit_qc=lambda q: q.update(checkpoint_format="gptq_v2"))
    with pytest.raises(GptqRepackError, match="the config says sym, but the zero .* reads 7"):
        repack_gptq(src, tmp_path / "a", progress=False)


def test_asym_v1_repacks_within_the_bound(g64, tmp_path):
    """Asymmetric zeros (some of them 16, stored 15) and fp16 scales that are not bf16 values:
    the writer repacks within the bound and reports a nonzero ratio."""
    gen = torch.Generator().manual_seed(0)

    def asym(t):
        for name in [n for n in t if n.endswith(".qzeros")]:
            t[name] = torch.randint(-2 ** 31, 2 ** 31 - 1, t[name].shape, generator=gen, dtype=torch.int32)
        for name in [n for n in t if n.endswith(".scales")]:
            t[name] = (t[name].float() * (1 + torch.rand(t[name].shape, generator=gen) / 7)).half()

    src = _rewrite(g64, tmp_path, asym, edit_qc=lambda q: q.update(sym=False))
    out = repack_gptq(src, tmp_path / "rp", progress=False)
    g, w = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    report = json.loads((out / REPORT_NAME).read_text())
    assert 0 < report["max_error_over_bound"] <= 1
    for e in report["tensors"]:
        base = e["name"][: -len(".weight")]
        ref = gptq_value(g, base, 64)
        ours = pack.dequantize_plain(w[f"{base}.weight_packed"], w[f"{base}.weight_scale"],
                                     w[f"{base}.weight_zero"], 64).double()
        scale = pack.expand_groups(w[f"{base}.weight_scale"].double().abs(), 64, ref.shape[1])
        # |q - 8| <= 8 and |zero| <= 8 |scale| (up to one bf16 rounding), so M <= 16.1 |scale|
        assert ((ours - ref).abs() <= gptq_repack.EPS * 16.1 * scale).all(), base
        assert not torch.equal(ours, ref)


def test_unsupported_group_is_refused(g64, tmp_path):
    src = g64
    with pytest.raises(GptqSourceError, match="GPTQ group 16 cannot be repacked: cpu_int4 groups are "
                                              "32, 64, 128"):
        repack_gptq(_rewrite(src, tmp_path, edit_qc=lambda q: q.update(group_size=16)),
                    tmp_path / "a", progress=False)


def test_a_bf16_model_is_refused(bf16, tmp_path):
    with pytest.raises(GptqSourceError, match="not a GPTQ or AWQ checkpoint"):
        repack_gptq(bf16, tmp_path / "a", progress=False)


def test_refuses_a_destination_it_did_not_make(g64, tmp_path):
    src = g64
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(DestinationError, match="not a vllm-edge gptq-repack build"):
        repack_gptq(src, other, progress=False)
    assert (other / "notes.txt").read_text() == "keep"
    out = repack_gptq(src, tmp_path / "rp", progress=False)
    assert repack_gptq(src, out, progress=False) == out  # its own build is replaced


def test_cli(g64, tmp_path):
    src = g64
    r = run_cli("models", "repack-gptq", str(src), str(tmp_path / "rp"), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["group_size"] == 64 and summary["max_error_over_bound"] == 0
    assert summary["out"] == str(tmp_path / "rp")
    r = run_cli("models", "repack-gptq", str(tmp_path / "nope"), str(tmp_path / "rp2"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error:" in r.stderr and "not a model directory" in r.stderr


def _as_awq(src, tmp_path, stored_zeros=None):
    """The GPTQ v1 export ``src`` rewritten as an AutoAWQ GEMM checkpoint of the same weights,
    with vLLM's own pack helpers and the interleave vLLM's CPU path applies to AWQ words.
    ``stored_zeros``: replace the GPTQ zero nibbles first (the GPTQ source gets them too)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        pack_quantized_values_into_int32 as vpack,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32 as vunpack,
    )
    from vllm.scalar_type import scalar_types

    u4, order = scalar_types.uint4, [0, 2, 4, 6, 1, 3, 5, 7]
    gptq = _rewrite(src, tmp_path / "gptq", stored_zeros,
                    edit_qc=(lambda q: q.update(sym=False)) if stored_zeros else None)

    def awq(t):
        for name in [n for n in t if n.endswith(".qweight")]:
            base = name[: -len(".qweight")]
            q = vunpack(t[name], u4, 0)  # GPTQ: [K/8, N] -> [K, N]
            k, n = q.shape
            t[name] = vpack(q.view(k, n // 8, 8)[:, :, order].reshape(k, n), u4, 1).contiguous()
            z = vunpack(t[f"{base}.qzeros"], u4, 1) + 1  # v1 stores zero - 1
            groups = z.shape[0]
            t[f"{base}.qzeros"] = vpack(z.view(groups, n // 8, 8)[:, :, order].reshape(groups, n),
                                        u4, 1).contiguous()
            t.pop(f"{base}.g_idx", None)

    def config(q):
        group = q["group_size"]
        q.clear()
        q.update(quant_method="awq", bits=4, group_size=group, zero_point=True, version="gemm")

    return gptq, _rewrite(gptq, tmp_path / "awq", awq, edit_qc=config)


@pytest.mark.parametrize("asym", [False, True], ids=["sym-zeros", "asym-zeros"])
def test_an_awq_checkpoint_repacks_to_the_same_build_as_its_gptq_twin(g64, tmp_path, asym):
    gen = torch.Generator().manual_seed(1)

    def zeros(t):  # 0..14 stored, so the AWQ twin's zero (stored + 1) still fits a nibble
        for name in [n for n in t if n.endswith(".qzeros")]:
            nib = torch.randint(0, 15, (*t[name].shape, 8), generator=gen, dtype=torch.int64)
            word = (nib << torch.arange(0, 32, 4)).sum(-1)  # 0 .. 2^32 - 1
            t[name] = ((word + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)

    gptq, awq = _as_awq(g64, tmp_path, zeros if asym else None)
    a = repack_gptq(gptq, tmp_path / "from-gptq", progress=False)
    b = repack_gptq(awq, tmp_path / "from-awq", progress=False)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    rb = json.loads((b / REPORT_NAME).read_text())
    assert rb["gptq"]["checkpoint_format"] == "awq" and rb["repacked"] > 0 and rb["max_error_over_bound"] <= 1
    assert manifest.read(b)["checkpoint_format"] == "awq"
    if asym:  # the zeros were really moved off 8, so the offsets carry them
        assert any(n.endswith(".weight_zero") and wb[n].abs().sum() > 0 for n in wb)


def test_awq_refusals(g64, tmp_path):
    _, awq = _as_awq(g64, tmp_path)
    for i, (edit, match) in enumerate([
            (lambda q: q.update(version="gemv"), "version='gemv'; only AWQ's GEMM packing"),
            (lambda q: q.update(zero_point=False), "zero_point=False"),
            (lambda q: q.update(bits=8), "bits=8")]):
        with pytest.raises(GptqSourceError, match=match):
            repack_gptq(_rewrite(awq, tmp_path / f"bad{i}", edit_qc=edit), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
