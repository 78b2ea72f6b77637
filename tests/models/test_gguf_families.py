"""GGUF families beyond Llama (gguf_families): Qwen2 (q/k/v biases), Qwen3 (q/k norms, a head
size from attention.key_length) and Gemma 3 (four norms a block stored as 1 + w, q/k norms)
import in bf16 as gguf dequantizes them, and repack into cpu_int4 with their codes kept in the
file's own row order (llama.cpp permutes q/k for Llama only). The tokenizer adds <bos> when the
file says so."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from support.checkpoints import no_partial_output, tiny_gguf, tiny_llama_gguf
from support.cli_runner import run_cli
from vllm_edge.models import gguf_families, gguf_repack
from vllm_edge.models.gguf_import import GgufImportError, import_gguf
from vllm_edge.models.gguf_repack import repack_gguf
from vllm_edge.quant import pack, repack

TYPES = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_0",
         "blk.0.attn_v.weight": "Q4_1", "blk.0.attn_output.weight": "Q4_0",
         "blk.0.ffn_gate.weight": "Q4_1", "blk.0.ffn_up.weight": "Q4_K", "blk.0.ffn_down.weight": "Q4_K"}
# Phi-3's fused tensors, as llama.cpp's convert writes them
PHI3_TYPES = {"token_embd.weight": "Q8_0", "blk.0.attn_qkv.weight": "Q4_K", "blk.0.attn_output.weight": "Q4_0",
              "blk.0.ffn_up.weight": "Q4_1", "blk.0.ffn_down.weight": "Q4_K"}
HIDDEN, FFN = 256, 512
# Qwen3's head size is its own (attention.key_length): 128 here, not hidden / heads = 64
HEAD = {"qwen2": None, "qwen3": 128, "gemma3": 128, "gemma2": 128, "phi3": None}
MODEL_TYPE = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text", "gemma2": "gemma2", "phi3": "phi3"}
FAMILIES = tuple(HEAD)


def types(arch):
    return PHI3_TYPES if arch == "phi3" else TYPES


def load(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def gguf_tensors(path):
    import gguf

    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def dequantized(t) -> torch.Tensor:
    import gguf

    a = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    return torch.from_numpy(a).reshape([int(d) for d in t.shape][::-1])


@pytest.fixture(scope="module", params=FAMILIES)
def family_file(request, tmp_path_factory):
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    src = tiny_llama_gguf(d / f"{arch}.gguf", hidden=HIDDEN, ffn=FFN, types=types(arch), arch=arch,
                          head_dim=HEAD[arch])
    return arch, src, import_gguf(src, d / "bf16", progress=False), repack_gguf(src, d / "rp", progress=False)


def test_the_import_holds_ggufs_dequantization_under_the_familys_names(family_file):
    arch, src, imported, _ = family_file
    fam = gguf_families.FAMILIES[arch]
    w = load(imported)
    names = {gguf_repack.hf_name(src, g, fam): t for g, t in gguf_tensors(src).items()}
    assert set(w) == set(names)  # every tensor, none dropped, none invented (tied head)
    for name, t in names.items():
        ref = dequantized(t)
        if fam.norm_plus_one and name.endswith("norm.weight"):
            ref = ref - 1  # Gemma's GGUF holds 1 + w
        assert torch.equal(w[name], ref.to(torch.bfloat16)), name  # no row permutation
    if arch == "qwen2":
        assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} <= set(w)
    elif arch in ("qwen3", "gemma3"):
        assert w["model.layers.0.self_attn.q_norm.weight"].shape == (HEAD[arch],)
    if arch == "phi3":  # the fused tensors whole: q, k, v rows and gate, up rows in the file's order
        assert w["model.layers.0.self_attn.qkv_proj.weight"].shape == ((4 + 2 * 2) * 64, HIDDEN)
        assert w["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * FFN, HIDDEN)
    if arch in ("gemma3", "gemma2"):
        assert {"model.layers.0.pre_feedforward_layernorm.weight",
                "model.layers.0.post_feedforward_layernorm.weight"} <= set(w)
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["architectures"] == [fam.hf_class] and cfg["model_type"] == MODEL_TYPE[arch]
    assert cfg["tie_word_embeddings"] is True
    if HEAD[arch]:
        assert cfg["head_dim"] == HEAD[arch]  # transformers' Qwen3 default (128) is not assumed


def test_the_repack_keeps_codes_in_the_files_row_order(family_file):
    arch, src, imported, rp = family_file
    fam = gguf_families.FAMILIES[arch]
    w, ref = load(rp), load(imported)
    report = json.loads((rp / gguf_repack.REPORT_NAME).read_text())
    chosen = types(arch)
    # the Q8_0 embedding keeps its codes as cpu_int8, and the tied head reads it (Gemma 2's with
    # patches/gemma2_embedding_quant.py, on by default)
    assert report["routes"] == {"repack": len(chosen) - 1, "repack8": 1}
    assert 0 < report["max_error_over_bound"] <= 1
    for g, t in gguf_tensors(src).items():
        name = gguf_repack.hf_name(src, g, fam)
        base = name[: -len(".weight")]
        if chosen.get(g, "Q8_0") != "Q8_0":
            n, k = int(t.shape[1]), int(t.shape[0])
            r = repack.decode(chosen[g], torch.from_numpy(np.array(t.data).reshape(n, -1)), k, g)
            for suffix, v in r.tensors().items():
                assert torch.equal(w[f"{base}.{suffix}"], v), (g, suffix)
            got = pack.dequantize_plain(w[f"{base}.weight_packed"], w[f"{base}.weight_scale"],
                                        w[f"{base}.weight_zero"], 32)
            rel = (got - ref[name].float()).norm() / ref[name].float().norm()
            assert rel < 0.01, (name, float(rel))  # the bf16 import, to the rounding of both
        elif len(t.shape) == 1:  # norms and biases: the import's bf16
            assert torch.equal(w[name], ref[name]), name
    cfg = json.loads((rp / "config.json").read_text())
    assert cfg["architectures"] == [fam.hf_class] and cfg["quantization_config"]["quant_method"] == "cpu_int4"


def test_a_q_k_row_permutation_would_be_caught(family_file, tmp_path, monkeypatch):
    """Were a Qwen file treated like a Llama one (rows permuted), the q rows would be wrong."""
    import dataclasses

    arch, src, imported, _ = family_file
    if arch == "phi3":
        pytest.skip("Phi-3's q rows are in the fused qkv_proj, which no family permutes")
    fam = gguf_families.FAMILIES[arch]
    monkeypatch.setitem(gguf_families.FAMILIES, arch, dataclasses.replace(fam, rope_permuted=True))
    out = repack_gguf(src, tmp_path / "rp", progress=False)
    base = "model.layers.0.self_attn.q_proj"
    w = load(out)
    got = pack.dequantize_plain(w[f"{base}.weight_packed"], w[f"{base}.weight_scale"], w[f"{base}.weight_zero"], 32)
    ref = load(imported)[f"{base}.weight"].float()
    assert (got - ref).norm() / ref.norm() > 0.5


@pytest.mark.parametrize("arch", [a for a in FAMILIES if a != "gemma2"])  # Gemma 2's head is tied
def test_an_untied_head_and_an_unkept_type_kept_bf16(tmp_path, arch):
    q = "blk.0.attn_qkv.weight" if arch == "phi3" else "blk.0.attn_q.weight"
    src = tiny_llama_gguf(tmp_path / "t.gguf", hidden=HIDDEN, ffn=FFN, arch=arch, head_dim=HEAD[arch],
                          tied=False, types={**types(arch), "output.weight": "Q4_0", q: "Q3_K"})
    out = repack_gguf(src, tmp_path / "rp", requantize=False, keep_embedding=True, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    # a bf16 tensor takes its fused siblings with it (Phi-3's are one tensor already)
    parts = ("qkv_proj",) if arch == "phi3" else ("k_proj", "q_proj", "v_proj")
    assert cfg["quantization_config"]["modules_to_not_convert"] == [
        f"model.layers.0.self_attn.{p}" for p in parts]
    assert "lm_head.weight_packed" in load(out)
    imported = json.loads((import_gguf(src, tmp_path / "bf16", progress=False) / "config.json").read_text())
    assert imported["tie_word_embeddings"] is False


def _rewrite(src, dst, drop=(), add=None):
    """A copy of GGUF ``src`` without the tensors ``drop`` and with ``add`` {name: f32 array}."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = r.get_field("general.architecture").contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.array(t.data), raw_shape=np.array(t.data).shape, raw_dtype=t.tensor_type)
    for name, a in (add or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("arch,drop,add,match", [
    ("qwen2", ["blk.0.attn_k.bias"], None, r"missing tensor blk\.0\.attn_k\.bias"),
    ("qwen2", ["blk.0.attn_q.bias"], {"blk.0.attn_q.bias": np.zeros(8, np.float32)},
     r"tensor blk\.0\.attn_q\.bias has shape \[8\], but the metadata makes it \[256\]"),
    ("qwen3", ["blk.0.attn_q_norm.weight"], None, r"missing tensor blk\.0\.attn_q_norm\.weight"),
    ("qwen3", [], {"blk.0.attn_gate.weight": np.zeros((256, 4), np.float32)},
     r"tensor blk\.0\.attn_gate\.weight has no place in a Qwen3 checkpoint"),
    # llama.cpp reads Gemma 2's head from the embedding: a head of its own would be dropped
    ("gemma2", [], {"output.weight": np.zeros((32, 256), np.float32)},
     r"tensor output\.weight has no place in a Gemma 2 checkpoint"),
    ("gemma2", ["blk.0.post_ffw_norm.weight"], None, r"missing tensor blk\.0\.post_ffw_norm\.weight"),
    ("phi3", [], {"rope_factors_long.weight": np.ones(32, np.float32)},
     r"tensor rope_factors_long\.weight: LongRoPE .* is not mapped yet"),
    ("phi3", ["blk.0.ffn_up.weight"], {"blk.0.ffn_up.weight": np.zeros((512, 256), np.float32)},
     r"tensor blk\.0\.ffn_up\.weight has shape \[256, 512\], but the metadata makes it \[256, 1024\]"),
])
def test_a_file_that_does_not_fit_its_family_is_refused_naming_the_tensor(tmp_path, arch, drop, add, match):
    good = tiny_llama_gguf(tmp_path / "good.gguf", hidden=HIDDEN, ffn=FFN, arch=arch, head_dim=HEAD[arch])
    bad = _rewrite(good, tmp_path / "bad.gguf", drop, add)
    for fn, out in ((import_gguf, tmp_path / "o1"), (repack_gguf, tmp_path / "o2")):
        with pytest.raises(GgufImportError, match=r"bad\.gguf: " + match):
            fn(bad, out, progress=False)
        assert no_partial_output(out)


def test_an_unknown_architecture_is_refused_with_the_list(tmp_path):
    f = tiny_gguf(tmp_path / "m.gguf", "mamba")
    listed = "(supported: " + ", ".join(gguf_families.FAMILIES) + ")"
    for fn, out in ((import_gguf, tmp_path / "o1"), (repack_gguf, tmp_path / "o2")):
        with pytest.raises(GgufImportError, match=r"m\.gguf: unsupported architecture 'mamba'") as e:
            fn(f, out, progress=False)
        assert listed in str(e.value)
    proc = run_cli("models", "import-gguf", str(f), str(tmp_path / "o3"), "--repack")
    assert proc.returncode == 2 and listed in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("arch,add_bos", [("qwen2", True), ("qwen2", False), ("qwen3", True)])
def test_the_tokenizer_adds_bos_when_the_file_says_so(tmp_path, arch, add_bos):
    """transformers' builder ignores tokenizer.ggml.add_bos_token (Gemma degenerates without its
    <bos>); the saved tokenizer, which vLLM loads, must honour it. (The tiny file's byte-level
    vocabulary is not Gemma's sentencepiece one: the real Gemma file is checked in
    test_gguf_families_engine.py.)"""
    from transformers import AutoTokenizer

    src = tiny_llama_gguf(tmp_path / "t.gguf", hidden=HIDDEN, ffn=FFN, arch=arch, head_dim=HEAD[arch],
                          add_bos=add_bos)
    bos = 29  # the tiny vocabulary's BOS id
    for out in (import_gguf(src, tmp_path / "bf16", progress=False),
                repack_gguf(src, tmp_path / "rp", progress=False)):
        ids = AutoTokenizer.from_pretrained(str(out))("ab a").input_ids
        assert (ids[0] == bos) is add_bos, ids


def test_a_base_model_without_chat_template_imports_but_a_llama_one_does_not(tmp_path):
    src = tiny_llama_gguf(tmp_path / "g.gguf", hidden=HIDDEN, ffn=FFN, arch="gemma3", head_dim=HEAD["gemma3"],
                          chat_template=False)
    out = import_gguf(src, tmp_path / "bf16", progress=False)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    llama = tiny_llama_gguf(tmp_path / "l.gguf", hidden=HIDDEN, ffn=FFN, chat_template=False)
    with pytest.raises(GgufImportError, match=r"l\.gguf: the GGUF carries no chat template"):
        import_gguf(llama, tmp_path / "l", progress=False)
    assert no_partial_output(tmp_path / "l")


def test_the_models_guide_lists_the_families():
    """One list: the guide's table has a row per family, in the registry's order, and no other."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "models.md").read_text()
    table = text.split("<!-- gguf-families")[1].split("<!-- /gguf-families -->")[0]
    rows = re.findall(r"^\| `([\w.-]+)` \| `(\w+)` \|", table, re.M)
    assert rows == [(f.arch, f.hf_class) for f in gguf_families.FAMILIES.values()]


def test_a_family_file_as_a_model_argument_builds_both_routes(tmp_path, monkeypatch):
    """`run --model FILE.gguf` (repack) and `--quant none` (bf16) through the resolver's store."""
    from vllm_edge.models import store

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    src = tiny_llama_gguf(tmp_path / "q.gguf", hidden=HIDDEN, ffn=FFN, types=TYPES, arch="qwen3",
                          head_dim=HEAD["qwen3"])
    for scheme, method in ((None, None), ("cpu_int4", "cpu_int4")):
        out = store.ensure_gguf(str(src), scheme)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["head_dim"] == HEAD["qwen3"]
        assert (cfg.get("quantization_config") or {}).get("quant_method") == method


def test_the_gemma2_and_phi3_configs_follow_the_metadata(family_file):
    """What transformers' reading leaves at the config class's defaults, from the file as
    llama.cpp reads it: Gemma 2's soft-caps, window, local/global layers and attention scale;
    Phi-3's tied head, its padding id, no window (llama.cpp turns it off), the whole head rotated."""
    arch, _, imported, rp = family_file
    if arch not in ("gemma2", "phi3"):
        pytest.skip("the other families' configs are checked above")
    for out in (imported, rp):
        cfg = json.loads((out / "config.json").read_text())
        if arch == "gemma2":
            assert (cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"]) == (20.0, 15.0)
            assert cfg["sliding_window"] == 16 and cfg["layer_types"] == ["sliding_attention"]
            assert cfg["query_pre_attn_scalar"] == HEAD["gemma2"] and cfg["head_dim"] == HEAD["gemma2"]
        else:
            assert cfg["sliding_window"] is None and cfg["pad_token_id"] is None
            assert cfg["tie_word_embeddings"] is True
            assert cfg["rope_parameters"]["partial_rotary_factor"] == 1.0


@pytest.mark.parametrize("pattern,want", [
    (None, "LGLG"), (3, "LLGL"), (0, "LLLL"), ([False, True, True, False], "GLLG")])
def test_gemma2_local_layers_follow_llama_cpps_pattern(tmp_path, pattern, want):
    """Layer i is local when i % n < n - 1 for a period n (2 when the file has none; 0: all local),
    or as the file's flags say."""
    from vllm_edge.models.gguf_import import gemma2_layer_types, inspect_gguf

    meta = {} if pattern is None else {"gemma2.attention.sliding_window_pattern": pattern}
    info = inspect_gguf(tiny_llama_gguf(tmp_path / "g.gguf", hidden=HIDDEN, ffn=FFN, arch="gemma2",
                                        head_dim=HEAD["gemma2"]))
    info.metadata.update(meta)
    got = "".join("L" if t == "sliding_attention" else "G" for t in gemma2_layer_types(info, 4))
    assert got == want


def test_without_the_embedding_patch_a_gemma2_repack_keeps_the_embedding_bf16(tmp_path, monkeypatch):
    """vLLM's Gemma2ForCausalLM builds its embedding unquantized when the patch is off: the repack
    keeps it as the import's bf16, says why, and is another build than the patched one's."""
    arch = "gemma2"
    src = tiny_llama_gguf(tmp_path / f"{arch}.gguf", hidden=HIDDEN, ffn=FFN, types=types(arch), arch=arch,
                          head_dim=HEAD[arch])
    on = gguf_repack.wanted("x")
    monkeypatch.setenv("VLLM_EDGE_PATCH_GEMMA2_EMBEDDING", "0")
    assert gguf_repack.wanted("x") != on  # the cache key follows the switch
    imported = import_gguf(src, tmp_path / "bf16", progress=False)
    rp = repack_gguf(src, tmp_path / "rp", progress=False)
    report = json.loads((rp / gguf_repack.REPORT_NAME).read_text())
    assert report["routes"] == {"repack": len(types(arch)) - 1, "bf16": 1}
    assert torch.equal(load(rp)["model.embed_tokens.weight"], load(imported)["model.embed_tokens.weight"])
    why = next(t["why"] for t in report["tensors"] if t["name"] == "model.embed_tokens.weight")
    assert "builds its embedding unquantized (VLLM_EDGE_PATCH_GEMMA2_EMBEDDING=0)" in why, why
