"""GGUF -> cpu_int4/cpu_int8 repack: the written checkpoint holds gguf's codes in the right rows,
each route does what the report says, and the writer never takes away what it did not make."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from support.checkpoints import no_partial_output, tiny_gguf, tiny_llama_gguf
from support.cli_runner import run_cli
from support.llamacpp import default_gguf
from vllm_edge.common import manifest
from vllm_edge.common.atomic import DestinationError
from vllm_edge.models import child, gguf_repack, resolver
from vllm_edge.models.gguf_repack import GgufRepackError, repack_gguf
from vllm_edge.quant import int8, pack, repack, repack8

# one tensor of each 4-bit type, and a Q8_0 embedding (kept as cpu_int8, the tied head reads it)
TYPES = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_0",
         "blk.0.attn_v.weight": "Q4_1", "blk.0.attn_output.weight": "Q4_0",
         "blk.0.ffn_gate.weight": "Q4_1", "blk.0.ffn_up.weight": "Q4_1", "blk.0.ffn_down.weight": "Q4_K"}
HIDDEN, FFN, HEADS, KV_HEADS = 256, 512, 4, 2


def tiny(path, **kw):
    return tiny_llama_gguf(path, hidden=HIDDEN, ffn=FFN, types={**TYPES, **kw.pop("types", {})}, **kw)


def weights(out):
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def dequant(w, base):
    if f"{base}.weight_int8" in w:
        q, s = w[f"{base}.weight_int8"], w[f"{base}.weight_scale"]
        return int8.dequantize(q, s, w[f"{base}.weight_zero"], q.shape[1] // s.shape[1])
    return pack.dequantize_plain(w[f"{base}.weight_packed"], w[f"{base}.weight_scale"],
                                 w[f"{base}.weight_zero"], 32)


def gguf_tensors(path):
    import gguf

    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_repack(tiny_file, tmp_path_factory):
    return repack_gguf(tiny_file, tmp_path_factory.mktemp("out") / "rp", progress=False)


@pytest.fixture(scope="module")
def tiny_import(tiny_file, tmp_path_factory):
    from vllm_edge.models.gguf_import import import_gguf

    return import_gguf(tiny_file, tmp_path_factory.mktemp("out") / "bf16", progress=False)


def test_every_repacked_tensor_holds_ggufs_codes_in_hf_row_order(tiny_file, tiny_repack):
    w = weights(tiny_repack)
    report = json.loads((tiny_repack / gguf_repack.REPORT_NAME).read_text())
    by_name = {e["gguf_name"]: e for e in report["tensors"]}
    for g, t in gguf_tensors(tiny_file).items():
        if TYPES.get(g, "Q8_0") == "Q8_0":
            continue
        base = gguf_repack.hf_name(tiny_file, g)[: -len(".weight")]
        n, k = int(t.shape[1]), int(t.shape[0])
        r = repack.decode(TYPES[g], torch.from_numpy(np.array(t.data).reshape(n, -1)), k, g)
        heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(g.split(".")[2])
        if heads:
            r = r.take_rows(gguf_repack.rope_rows(n, heads))
        for suffix, v in r.tensors().items():
            assert torch.equal(w[f"{base}.{suffix}"], v), (g, suffix)
        assert by_name[g]["route"] == "repack" and 0 < by_name[g]["max_error_over_bound"] <= 1
    assert report["routes"] == {"repack": 7, "repack8": 1}  # the head is tied to the embedding
    t = gguf_tensors(tiny_file)["token_embd.weight"]
    r = repack8.decode("Q8_0", torch.from_numpy(np.array(t.data).reshape(int(t.shape[1]), -1)), int(t.shape[0]))
    for suffix, v in r.tensors().items():
        assert torch.equal(w[f"model.embed_tokens.{suffix}"], v), suffix
    assert by_name["token_embd.weight"]["route"] == "repack8"
    assert by_name["token_embd.weight"]["max_error_over_bound"] == 0  # Q8_0: fp16 scales kept as they are
    assert 0 < report["max_error_over_bound"] <= 1


def test_the_repack_agrees_with_the_bf16_import(tiny_repack, tiny_import):
    """transformers' own conversion (names, q/k order) of the same file, to the rounding of
    both: a wrong name or row order is off by the size of the weights."""
    from safetensors.torch import load_file

    ref = load_file(str(tiny_import / "model.safetensors"))
    w = weights(tiny_repack)
    for name, v in ref.items():
        base = name[: -len(".weight")]
        if f"{base}.weight_packed" not in w and f"{base}.weight_int8" not in w:
            assert torch.equal(w[name], v), name  # the norms: the same bf16
            continue
        got = dequant(w, base)
        rel = (got - v.float()).norm() / v.float().norm()
        assert rel < 0.01, (name, float(rel))  # both hold the file's values, to 2^-8


def test_a_wrong_q_k_row_order_is_caught(tiny_file, tiny_import, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setattr(gguf_repack, "rope_rows", lambda rows, n_head: torch.arange(rows))
    out = repack_gguf(tiny_file, tmp_path / "rp", progress=False)
    ref = load_file(str(tiny_import / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"]
    got = dequant(weights(out), "model.layers.0.self_attn.q_proj")
    assert (got - ref.float()).norm() / ref.float().norm() > 0.5


def test_rope_rows_undo_the_exporters_permutation():
    from vllm_edge.models.gguf_export import rope_interleave

    hf = torch.arange(12 * 64).reshape(12 * 64, 1)
    assert torch.equal(rope_interleave(hf, 12)[gguf_repack.rope_rows(12 * 64, 12)], hf)


def test_config_manifest_and_tied_head(tiny_file, tiny_repack):
    cfg = json.loads((tiny_repack / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "cpu_int4" and qc["group_size"] == 32 and qc["quantize_embedding"]
    assert qc["modules_to_not_convert"] == [] and cfg["tie_word_embeddings"] is True
    entry = {"format": "cpu_int8", "group_size": 32}
    assert qc["layer_formats"] == {"lm_head": entry, "model.embed_tokens": entry}
    w = weights(tiny_repack)
    assert not any(k.startswith("lm_head") for k in w)  # one table, as in the file
    m = manifest.read(tiny_repack)
    assert m["converter"] == gguf_repack.CONVERTER_VERSION and m["scheme"] == "cpu_int4"
    assert m["requantize"] is True and m["keep_embedding"] is False and manifest.problem(tiny_repack) is None
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tiny_repack / f).is_file(), f


def test_no_requantize_keeps_an_unkept_type_and_its_fused_siblings_bf16(tmp_path, tiny_import):
    src = tiny(tmp_path / "t.gguf", types={"blk.0.attn_q.weight": "Q3_K"})
    out = repack_gguf(src, tmp_path / "rp", requantize=False, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    layer = "model.layers.0.self_attn"
    assert cfg["quantization_config"]["modules_to_not_convert"] == [f"{layer}.{p}" for p in
                                                                   ("k_proj", "q_proj", "v_proj")]
    report = {e["name"]: e for e in json.loads((out / gguf_repack.REPORT_NAME).read_text())["tensors"]}
    assert report[f"{layer}.k_proj.weight"]["why"].startswith(f"fused with {layer}.q_proj")
    w = weights(out)
    assert w[f"{layer}.q_proj.weight"].dtype == torch.bfloat16
    assert f"{layer}.o_proj.weight_packed" in w  # not fused with q: still repacked
    assert "model.embed_tokens.weight_int8" in w  # a kept type is kept either way


def test_an_unkept_type_is_refused_by_name_and_nothing_is_written(tmp_path):
    src = tiny(tmp_path / "t.gguf", types={"blk.0.ffn_down.weight": "Q3_K", "blk.0.ffn_up.weight": "Q2_K"})
    with pytest.raises(GgufRepackError, match=r"t\.gguf: tensor model\.layers\.0\.mlp\.(down|up)_proj\.weight "
                                              r"is Q[23]_K, a type whose codes vllm-edge does not keep "
                                              r"\(2 tensors: Q2_K, Q3_K\); kept: Q4_0, .*--no-requantize"):
        repack_gguf(src, tmp_path / "rp", progress=False)
    assert no_partial_output(tmp_path / "rp")


def test_a_6_bit_tensor_takes_its_fused_4_bit_siblings_to_cpu_int8_codes_kept(tmp_path):
    """q (Q4_K) and k (Q4_0) share vLLM's qkv_proj with v (Q6_K, groups of 16): all three are
    written as cpu_int8 at group 16, the 4-bit codes carried over as they are."""
    src = tiny(tmp_path / "t.gguf", types={"blk.0.attn_v.weight": "Q6_K"})
    out = repack_gguf(src, tmp_path / "rp", progress=False)
    w = weights(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    layer = "model.layers.0.self_attn"
    for p in ("q_proj", "k_proj", "v_proj"):
        assert qc["layer_formats"][f"{layer}.{p}"] == {"format": "cpu_int8", "group_size": 16}
        assert w[f"{layer}.{p}.weight_scale"].shape[1] == HIDDEN // 16
    assert f"{layer}.o_proj.weight_packed" in w and f"{layer}.o_proj" not in qc["layer_formats"]
    tensors = gguf_tensors(src)
    t = tensors["blk.0.attn_k.weight"]
    n, k = int(t.shape[1]), int(t.shape[0])
    r4 = repack.decode("Q4_0", torch.from_numpy(np.array(t.data).reshape(n, -1)), k)
    r4 = r4.take_rows(gguf_repack.rope_rows(n, KV_HEADS))
    assert torch.equal(w[f"{layer}.k_proj.weight_int8"], (r4.codes.to(torch.int16) - 8).to(torch.int8))
    report = {e["name"]: e for e in json.loads((out / gguf_repack.REPORT_NAME).read_text())["tensors"]}
    assert report[f"{layer}.q_proj.weight"]["route"] == "repack8"
    assert "fused with model.layers.0.self_attn.v_proj (Q6_K)" in report[f"{layer}.q_proj.weight"]["why"]
    assert all(0 <= report[f"{layer}.{p}.weight"]["max_error_over_bound"] <= 1 for p in ("q_proj", "k_proj", "v_proj"))
    import gguf

    t = tensors["blk.0.attn_v.weight"]
    ref = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(int(t.shape[1]), -1)
    got = dequant(w, f"{layer}.v_proj")
    assert float((got - torch.from_numpy(ref)).abs().max()) <= float(np.abs(ref).max()) * 2 ** -10


def test_a_float_tensor_is_kept_at_its_precision(tmp_path):
    src = tiny(tmp_path / "t.gguf", types={"blk.0.attn_output.weight": None})
    out = repack_gguf(src, tmp_path / "rp", progress=False)
    report = {e["name"]: e for e in json.loads((out / gguf_repack.REPORT_NAME).read_text())["tensors"]}
    e = report["model.layers.0.self_attn.o_proj.weight"]
    assert e["route"] == "bf16" and e["gguf_type"] == "F32" and e["bits_per_weight"] == 16
    assert weights(out)["model.layers.0.self_attn.o_proj.weight"].dtype == torch.bfloat16


def test_keep_embedding(tmp_path, tiny_file):
    out = repack_gguf(tiny_file, tmp_path / "rp", keep_embedding=True, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["quantization_config"]["quantize_embedding"] is False
    w = weights(out)
    assert w["model.embed_tokens.weight"].dtype == torch.bfloat16 and not any(k.startswith("lm_head") for k in w)


def test_an_untied_head_takes_its_own_route(tmp_path):
    src = tiny(tmp_path / "t.gguf", tied=False, types={"output.weight": "Q4_0"})
    out = repack_gguf(src, tmp_path / "rp", keep_embedding=True, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["quantization_config"]["quantize_embedding"] is False
    w = weights(out)
    assert "lm_head.weight_packed" in w and w["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_refuses_to_overwrite_what_it_did_not_make(tmp_path, tiny_file, tiny_import):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(DestinationError, match=r"mine: exists and is a directory with 1 entries that "
                                                 r"is not a vllm-edge gguf-repack build"):
        repack_gguf(tiny_file, mine, progress=False)
    assert (mine / "notes.txt").read_text() == "keep me"
    # a bf16 import is a vllm-edge build, but of another kind
    before = sorted(p.name for p in tiny_import.iterdir())
    with pytest.raises(DestinationError, match="not a vllm-edge gguf-repack build"):
        repack_gguf(tiny_file, tiny_import, progress=False)
    assert sorted(p.name for p in tiny_import.iterdir()) == before
    proc = run_cli("models", "import-gguf", str(tiny_file), str(mine), "--repack")
    assert proc.returncode == 2 and "pass --force to replace it" in proc.stderr
    assert (mine / "notes.txt").exists()
    out = repack_gguf(tiny_file, mine, force=True, progress=False)
    assert not (out / "notes.txt").exists() and manifest.problem(out) is None


def test_a_second_repack_is_a_no_op_and_new_options_rebuild(tmp_path, tiny_file):
    out = repack_gguf(tiny_file, tmp_path / "rp", progress=False)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    repack_gguf(tiny_file, out, progress=False)
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    repack_gguf(tiny_file, out, keep_embedding=True, progress=False)
    assert manifest.read(out)["keep_embedding"] is True


def test_cli(tmp_path, tiny_file):
    out = tmp_path / "rp"
    proc = run_cli("models", "import-gguf", str(tiny_file), str(out), "--repack", "--keep-embedding")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(out)
    assert manifest.read(out)["keep_embedding"] is True
    for extra, msg in ((["--keep-embedding"], "apply to --repack only"),
                       (["--no-requantize"], "apply to --repack only"),
                       (["--repack", "--verify"], "cannot load a cpu_int4 checkpoint")):
        proc = run_cli("models", "import-gguf", str(tiny_file), str(tmp_path / "x"), *extra)
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and no_partial_output(tmp_path / "x")


def test_bad_files_are_named(tmp_path):
    f = tiny_gguf(tmp_path / "g.gguf", "bert")
    with pytest.raises(GgufRepackError, match=r"g.gguf: unsupported architecture 'bert'"):
        repack_gguf(f, tmp_path / "o1", progress=False)
    assert no_partial_output(tmp_path / "o1")
    with pytest.raises(GgufRepackError, match=r"x.gguf: tensor rope_freqs.weight has no place"):
        gguf_repack.hf_name(tmp_path / "x.gguf", "rope_freqs.weight")


def test_a_non_finite_scale_fails_naming_file_and_tensor(tmp_path, tiny_file):
    bad = tmp_path / "bad.gguf"
    data = bytearray(tiny_file.read_bytes())
    t = gguf_tensors(tiny_file)["blk.0.attn_k.weight"]  # Q4_0: d is the first 2 bytes of a block
    data[t.data_offset:t.data_offset + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    bad.write_bytes(bytes(data))
    with pytest.raises(GgufRepackError, match=r"bad\.gguf: tensor blk\.0\.attn_k\.weight: d of block 0 "
                                              r"in row 0 is not finite"):
        repack_gguf(bad, tmp_path / "o", progress=False)
    assert no_partial_output(tmp_path / "o")


# --- the default model ------------------------------------------------------------------

def test_default_model_keeps_its_q4_1_codes(default_repacked_dir, default_int4_dir):
    """Against today's requantized build of the bf16 import: the same 4-bit codes in every
    linear (a dequantized Q4_1 requantizes onto its own grid), scales and offsets closer to the
    GGUF's own values, and the Q8_0 embedding kept in 8 bits with the head tied to it."""
    import gguf

    report = json.loads((default_repacked_dir / gguf_repack.REPORT_NAME).read_text())
    assert report["routes"] == {"repack": 210, "repack8": 1} and report["max_error_over_bound"] <= 1
    assert report["tensors"][0]["gguf_type"] == "Q8_0" or any(
        e["gguf_type"] == "Q8_0" and e["route"] == "repack8" for e in report["tensors"])
    a, b = weights(default_int4_dir), weights(default_repacked_dir)
    linears = {k for k in a if k.endswith("weight_packed") and "embed_tokens" not in k and "lm_head" not in k}
    assert linears == {k for k in b if k.endswith("weight_packed")}
    for k in linears:
        assert torch.equal(a[k], b[k]), k
    assert "model.embed_tokens.weight_int8" in b and not any(k.startswith("lm_head") for k in b)
    src = default_gguf()
    err = {"requantized": 0.0, "repacked": 0.0}
    for t in gguf.GGUFReader(str(src)).tensors:
        if t.tensor_type.name != "Q4_1":
            continue
        name = gguf_repack.hf_name(src, t.name)[: -len(".weight")]
        ref = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))).double()
        heads = {"q_proj": 9, "k_proj": 3}.get(name.rsplit(".", 1)[1])
        if heads:
            ref = ref[gguf_repack.rope_rows(ref.shape[0], heads)]
        for label, w in (("requantized", a), ("repacked", b)):
            err[label] += float((dequant(w, name).double() - ref).pow(2).sum())
    print(err)
    assert err["repacked"] < err["requantized"] / 2


# --- a GGUF file as a model argument --------------------------------------------------------

def test_a_gguf_model_argument_is_repacked_once_and_cached_by_content(tmp_path, tiny_file, monkeypatch):
    from vllm_edge.models import store
    from vllm_edge.runtime import weight_path

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": ["avx512f"]}))
    path, wpath = weight_path.model_for_engine(str(tiny_file))
    assert wpath.name == "cpu_int4" and any("keeps its codes" in r for r in wpath.reasons)
    assert path.parent == tmp_path / "home" / "models" / "gguf" and path.name.endswith("-repack")
    from vllm_edge.models.gguf_import import sha256_file

    assert path.name.startswith(sha256_file(tiny_file)[:16]) and manifest.problem(path) is None
    assert json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"] == "cpu_int4"

    def no_child(*a, **k):
        raise AssertionError("a cached build must not be prepared again")

    monkeypatch.setattr(child, "run", no_child)
    copy = tmp_path / "copy.gguf"  # another path, the same bytes: the same build
    copy.write_bytes(tiny_file.read_bytes())
    assert resolver.ensure_model(str(copy), "cpu_int4", 32) == path
    monkeypatch.undo()
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VLLM_EDGE_HW_PROFILE", json.dumps({"arch": "x86_64", "isa": ["avx512f"]}))
    bf16, wpath = weight_path.model_for_engine(str(tiny_file), dtype="bf16")
    assert wpath.name == "bf16" and bf16.name.endswith("-bf16")
    assert "quantization_config" not in json.loads((bf16 / "config.json").read_text())


def test_a_gguf_model_argument_is_checked(tmp_path, tiny_file, monkeypatch):
    from vllm_edge.models import store
    from vllm_edge.models.store import ModelNotAvailable

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelNotAvailable, match=r"nope.gguf: no such GGUF file"):
        resolver.ensure_model(str(tmp_path / "nope.gguf"), "cpu_int4", 32)
    with pytest.raises(ModelNotAvailable, match=r"repacked at group 32 .*not 64"):
        resolver.ensure_model(str(tiny_file), "cpu_int4", 64)
    with pytest.raises(ModelNotAvailable, match=r"has no gptq build"):
        resolver.ensure_model(str(tiny_file), "gptq", 64 // 2)
    assert not (tmp_path / "home" / "models").exists()
