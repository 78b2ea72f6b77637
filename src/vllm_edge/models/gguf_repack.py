"""GGUF (the families of :mod:`.gguf_families`) -> a checkpoint that keeps llama.cpp's own codes:
4-bit tensors as ``cpu_int4`` g32, 5-, 6- and 8-bit ones as ``cpu_int8``, mixed per layer as the
file mixes them (``layer_formats`` in the quantization config).

Every 2-D weight takes one route, recorded per tensor in ``repack_report.json``:

- ``repack``: Q4_0, Q4_1 and Q4_K keep their integer codes as cpu_int4; only the per-group
  scale and offset are rounded to bf16 (:mod:`vllm_edge.quant.repack`, which states the bound);
- ``repack8``: Q8_0, Q6_K, Q5_0, Q5_1 and Q5_K keep their integer codes as cpu_int8; only the
  scale and offset are rounded to fp16 (:mod:`vllm_edge.quant.repack8`, its bound). A 4-bit
  tensor fused with one of these (vLLM runs q/k/v and gate/up as one layer, in one format) is
  carried over with it, its codes kept too, at the smallest group of the layer;
- ``bf16``: a float tensor (F16, BF16, F32) at its precision; gguf's dequantization of a type
  whose codes are not kept with ``requantize=False``; the embedding with ``keep_embedding``. A
  bf16 tensor takes its fused siblings to bf16 too.

Each kept tensor is checked against gguf's own dequantization before it is written, and the
worst ratio to its bound is reported. A type whose codes no route keeps (Q2_K, Q3_K, the IQ
types, ...) is refused by name, unless ``requantize=False`` runs its dequantization in bf16.

Norms and biases are written in bf16 (Gemma's norms less the 1 its GGUF adds). The q/k rows
are put back in HF order for the families whose rope llama.cpp's convert permuted (Llama). A
head tied to a quantized embedding stays tied: vLLM reads the one table, as llama.cpp does. The
config and tokenizer come from transformers' reading of the GGUF metadata (no weights), as in
:mod:`.gguf_import`; the header is validated there first by our own bounded reader.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from vllm_edge.common import atomic, manifest
from vllm_edge.models import gguf_families, gguf_import
from vllm_edge.models.gguf_import import GgufImportError
from vllm_edge.quant.formats import cpu_int4, cpu_int8

logger = logging.getLogger("vllm_edge.models")

# Bump when the output changes, so cached repacks are redone.
CONVERTER_VERSION = "gguf-repack/9"
KIND = CONVERTER_VERSION.split("/")[0]
REPORT_NAME = "repack_report.json"
GROUP = 32

_GLOBAL = {g: hf for g, (hf, _) in gguf_families.GLOBAL.items()}
# vLLM loads these into one layer each (qkv_proj, gate_up_proj): one method for the group
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_FLOATS = ("F32", "F16", "BF16")
_EIGHT = ("repack8",)


class GgufRepackError(GgufImportError):
    """A GGUF that cannot be repacked; the message names the file and tensor."""


def hf_name(path: Path, gguf_name: str, fam: gguf_families.Family = gguf_families.LLAMA) -> str:
    """The Hugging Face name of a GGUF tensor, in a checkpoint of family ``fam``."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+\.(?:weight|bias))", gguf_name)
    layer = fam.layer_names()
    if m and m[2] in layer:
        return f"model.layers.{m[1]}.{layer[m[2]]}"
    raise GgufRepackError(f"{path}: tensor {gguf_name} has no place in a {fam.title} checkpoint "
                          f"(the repack knows the tensors of a plain {fam.title}; rope scaling "
                          "tensors are not supported)")


def rope_rows(rows: int, n_head: int):
    """Row order that undoes llama.cpp's q/k permutation (GGUF row ``j`` of a head holds the
    HF rows of rotation pair ``j // 2``): ``hf = gguf[index]``. A row permutation moves codes,
    scales and offsets together, so it is exact."""
    import torch

    d = rows // n_head
    # GGUF row (h, i, half) came from HF row (h, half, i); invert by reading it back
    return torch.arange(rows).reshape(n_head, d // 2, 2).transpose(1, 2).reshape(rows)


def _fused_group(name: str) -> list[str]:
    base = name[: -len(".weight")]
    head, _, last = base.rpartition(".")
    for group in _FUSED:
        if last in group:
            return [f"{head}.{s}.weight" for s in group]
    return [name]


def plan_routes(types: dict[str, str], *, requantize: bool, keep_embedding: bool,
                tied: bool, path: str = "?", embedding_why: str | None = None) -> dict[str, tuple[str, str]]:
    """HF weight name -> (route, why) for every 2-D weight, given its GGUF type name.

    Pure: the routes follow from the types and the options alone."""
    from vllm_edge.quant import repack, repack8

    routes: dict[str, tuple[str, str]] = {}
    refused = {}
    for name, t in types.items():
        if name == "model.embed_tokens.weight" and (keep_embedding or embedding_why):
            routes[name] = ("bf16", (embedding_why or "keep_embedding") + ": the token embedding stays bf16"
                            + (" (the tied head reads it)" if tied else ""))
        elif t in repack.FORMATS:
            routes[name] = ("repack", f"{t} codes kept as {cpu_int4.NAME} g32")
        elif t in repack8.FORMATS:
            routes[name] = ("repack8", f"{t} codes kept as {cpu_int8.NAME} g{repack8.BLOCKS[t][2]}")
        elif t in _FLOATS:
            routes[name] = ("bf16", f"{t} kept at its precision, in bf16")
        elif not requantize:
            routes[name] = ("bf16", f"{t} codes are not kept; its dequantization runs in bf16 "
                                    "(requantize=False)")
        else:
            refused[name] = t
    if refused:
        name, t = next(iter(refused.items()))
        raise GgufRepackError(
            f"{path}: tensor {name} is {t}, a type whose codes vllm-edge does not keep "
            f"({len(refused)} tensors: {', '.join(sorted(set(refused.values())))}); kept: "
            f"{', '.join(repack.FORMATS + repack8.FORMATS + _FLOATS)}. Repack with "
            "--no-requantize to run such tensors in bf16, or use a file of the kept types.")
    for name, (route, why) in list(routes.items()):
        if route != "bf16":
            continue
        for sib in _fused_group(name):
            if sib != name and sib in routes and routes[sib][0] != "bf16":
                routes[sib] = ("bf16", f"fused with {name[: -len('.weight')]}, which stays bf16 "
                                       f"({types[name]})")
    for name, (route, why) in list(routes.items()):
        if route not in _EIGHT:
            continue
        for sib in _fused_group(name):
            if sib != name and routes.get(sib, ("",))[0] == "repack":
                routes[sib] = ("repack8", f"{types[sib]} codes kept as {cpu_int8.NAME}: fused with "
                                          f"{name[: -len('.weight')]} ({types[name]})")
    return routes


def layer_groups(types: dict[str, str], routes: dict[str, tuple[str, str]]) -> dict[str, int]:
    """The cpu_int8 group of every 8-bit weight: its type's, or the smallest of its fused layer
    (parts of one vLLM layer share one group; repeating a scale is exact)."""
    from vllm_edge.quant import repack8

    own = {n: (repack8.BLOCKS[types[n]][2] if r == "repack8" and types[n] in repack8.BLOCKS else 32)
           for n, (r, _) in routes.items() if r in _EIGHT}
    return {n: min(own.get(s, g) for s in _fused_group(n)) for n, g in own.items()}


def _runtime_bits(name: str, specs: dict[str, Any]) -> float:
    """Bits per weight a decode step reads for weight ``name`` where cpu_int8's codes are packed
    at load: as :mod:`vllm_edge.quant.int8_linear` packs its vLLM layer, a fused layer's parts
    each on their own or all together (:func:`vllm_edge.quant.lowbit.layout`)."""
    from vllm_edge.quant import lowbit

    names = [s for s in _fused_group(name) if s in specs]
    plan = lowbit.layout([specs[s] for s in names])
    spec = plan[0] if len(plan) == 1 else plan[names.index(name)]
    return spec.bits() / (spec.rows * spec.cols)


def repack_gguf(src: str | os.PathLike, out: str | os.PathLike, *, requantize: bool = True,
                keep_embedding: bool = False, force: bool = False, progress: bool = True) -> Path:
    """Write the cpu_int4 g32 checkpoint of GGUF ``src`` to ``out`` (atomically, with a
    manifest and ``repack_report.json``). A second call with the same source and options is
    a no-op; an existing ``out`` that is not a repack is refused unless ``force``."""
    src, out = Path(src).resolve(), Path(out).expanduser().resolve()
    info = gguf_import.inspect_gguf(src)
    fam = gguf_import.check_architecture(info, GgufRepackError)
    gguf_import._check_tokenizer(info)
    gguf_import.check_header(info, fam)
    atomic.check_destination(out, kind=KIND, inputs=[src], force=force)
    want = wanted(gguf_import.sha256_file(src), requantize=requantize, keep_embedding=keep_embedding)
    return atomic.build_once(out, want, lambda: _write(src, out, info, want, force=force, progress=progress),
                             force=force, log=logger, redo="repacking again",
                             ready=f"{out} is already repacked from {src.name}")


def wanted(source_sha256: str, *, requantize: bool = True, keep_embedding: bool = False) -> dict:
    """The manifest fields a repack of that source with those options carries (the cache key).
    A family whose quantized embedding needs a patch is keyed on its switch too: a build made with
    it on has a table the unpatched model cannot load, so switching it off makes another build."""
    switches = {f.arch: f.quantized_embedding() for f in gguf_families.FAMILIES.values() if f.embedding_switch}
    return {"source_sha256": source_sha256, "converter": CONVERTER_VERSION, "scheme": cpu_int4.NAME,
            "group_size": GROUP, "requantize": requantize, "keep_embedding": keep_embedding,
            "embedding_switches": switches}


def _read_config(src: Path, info) -> tuple[Any, Any, Any]:
    """transformers' config, generation config and tokenizer from the GGUF metadata."""
    from transformers import GenerationConfig

    tok = gguf_import.read_tokenizer(src, info)
    config = gguf_import.read_config(src, info)
    gguf_import.check_chat_template(src, info, tok, GgufRepackError)
    return config, GenerationConfig.from_model_config(config), tok


def _write(src: Path, out: Path, info, want: dict, *, force: bool, progress: bool) -> Path:
    import gguf
    import numpy as np
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    from vllm_edge.quant import lowbit, repack, repack8
    from vllm_edge.quant.formats.cpu_int4 import quantization_config as cpu_int4_config
    from vllm_edge.quant.quantize import mean_bits_per_weight

    started = time.time()
    config, gen_config, tok = _read_config(src, info)
    fam = gguf_families.FAMILIES[info.architecture]
    meta = info.metadata
    heads = meta[f"{fam.arch}.attention.head_count"]
    kv_heads = meta.get(f"{fam.arch}.attention.head_count_kv", heads)
    tied = "output.weight" not in info.tensors
    reader = gguf.GGUFReader(str(src))
    tensors = {t.name: t for t in reader.tensors}
    names = {g: hf_name(src, g, fam) for g in tensors}
    types = {names[g]: t.tensor_type.name for g, t in tensors.items() if len(t.shape) == 2}
    routes = plan_routes(types, requantize=want["requantize"], keep_embedding=want["keep_embedding"],
                         tied=tied, path=str(src),
                         embedding_why=None if want["embedding_switches"].get(fam.arch, True) else
                         f"vLLM's {fam.hf_class} builds its embedding unquantized "
                         f"({fam.embedding_switch}=0)")
    groups = layer_groups(types, routes)
    # llama.cpp permuted the q/k rows of rope-permuted families only
    rows_order = {"self_attn.q_proj": heads, "self_attn.k_proj": kv_heads} if fam.rope_permuted else {}

    out_tensors: dict[str, torch.Tensor] = {}
    report: list[dict[str, Any]] = []
    packed_specs: dict[str, Any] = {}
    for g, t in tqdm(tensors.items(), desc=f"repack {src.name}", unit="tensor", disable=not progress):
        name = names[g]
        dims = tuple(int(d) for d in t.shape)  # GGUF order: a row's length first
        n_heads = next((h for key, h in rows_order.items() if f".{key}." in name), None)
        order = rope_rows(dims[-1], n_heads) if n_heads else None  # a weight's rows, or a bias
        if name not in routes:  # norms and biases
            w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
            if fam.norm_plus_one and name.endswith("norm.weight"):
                w = w - 1  # in float32, then rounded once, as transformers' reading does
            if order is not None:
                w = w[order]
            out_tensors[name] = w.reshape(dims[::-1]).to(torch.bfloat16).contiguous()
            continue
        route, why = routes[name]
        n, k = dims[1], dims[0]
        entry: dict[str, Any] = {"name": name, "gguf_name": g, "gguf_type": t.tensor_type.name,
                                 "shape": [n, k], "route": route, "why": why}
        base = name[: -len(".weight")]
        ref = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(n, k))
        ref_rows = ref[order] if order is not None else ref
        parts = None
        try:
            if route in ("repack", "repack8"):
                raw = torch.from_numpy(np.array(t.data).view(np.uint8).reshape(n, -1))
                typ = t.tensor_type.name
                if route == "repack":
                    r = repack.decode(typ, raw, k, g)
                    entry["max_error_over_bound"] = round(repack.check(r, ref, g), 6)
                else:
                    r = (repack8.from_int4(repack.decode(typ, raw, k, g)) if typ in repack.FORMATS
                         else repack8.decode(typ, raw, k, g)).regroup(groups[name])
                    entry["max_error_over_bound"] = round(repack8.check(r, ref, g), 6)
                    entry["group"] = r.group
                if order is not None:
                    r = r.take_rows(order)
                parts = r.tensors()
            else:
                out_tensors[name] = ref_rows.to(torch.bfloat16).contiguous()
        except (repack.RepackError, ValueError) as exc:
            raise GgufRepackError(f"{src}: {exc}") from None
        if parts is not None:
            out_tensors.update({f"{base}.{s}": v for s, v in parts.items()})
            bits = sum(v.numel() * v.element_size() * 8 for v in parts.values())
        else:
            bits = n * k * 16
        entry["bits_per_weight"] = round(bits / (n * k), 4)
        # what decode reads where cpu_int8's codes are packed at load (quant/lowbit.py); a fused
        # layer's parts are settled below, once all of them are known
        if route == "repack8":
            packed_specs[name] = lowbit.part_spec(parts["weight_int8"], parts["weight_scale"],
                                                  parts["weight_zero"], entry["group"])
        entry["runtime_bits_per_weight"] = round(bits / (n * k), 4)
        entry["gguf_bits_per_weight"] = round(t.n_bytes * 8 / (n * k), 4)
        report.append(entry)
    for entry in report:
        if entry["name"] in packed_specs:
            entry["runtime_bits_per_weight"] = round(_runtime_bits(entry["name"], packed_specs), 4)

    embed = routes["model.embed_tokens.weight"][0]
    layer_formats = {name[: -len(".weight")]: {"format": cpu_int8.NAME, "group_size": groups[name]}
                     for name, (r, _) in routes.items() if r in _EIGHT}
    if tied and "model.embed_tokens" in layer_formats:
        layer_formats["lm_head"] = layer_formats["model.embed_tokens"]  # the head reads the table
    skip = sorted({n[: -len(".weight")] for n, (r, _) in routes.items()
                   if r == "bf16" and n != "model.embed_tokens.weight"})
    qcfg = cpu_int4_config(GROUP, quantize_embedding=embed != "bf16", modules_to_not_convert=skip)
    if layer_formats:
        qcfg["layer_formats"] = dict(sorted(layer_formats.items()))
    config.quantization_config = qcfg
    config.architectures = [fam.hf_class]
    # a tied head reads the embedding's own tensors, in whatever format they are
    config.tie_word_embeddings = tied
    config.dtype = torch.bfloat16

    counts: dict[str, int] = {}
    for e in report:
        counts[e["route"]] = counts.get(e["route"], 0) + 1
    ours = sum(e["bits_per_weight"] * e["shape"][0] * e["shape"][1] for e in report)
    theirs = sum(e["gguf_bits_per_weight"] * e["shape"][0] * e["shape"][1] for e in report)
    runtime = sum(e["runtime_bits_per_weight"] * e["shape"][0] * e["shape"][1] for e in report)
    summary = {
        "source": str(src), "gguf_types": sorted({e["gguf_type"] for e in report}),
        "group_size": GROUP, "requantize": want["requantize"], "keep_embedding": want["keep_embedding"],
        "bound": {"repack": {"eps": repack.EPS, "per_weight": "|ours - gguf| <= eps * (|q - 8| |scale| "
                             "+ |zero|), scale and zero exact (quant/repack.py)"},
                  "repack8": {"eps": repack8.EPS, "tiny": repack8.TINY,
                              "per_weight": "|ours - gguf| <= eps * (|c| |scale| + |zero|) + tiny * "
                              "(|c| + 1), scale and zero exact (quant/repack8.py)"}},
        "max_error_over_bound": max((e["max_error_over_bound"] for e in report
                                     if "max_error_over_bound" in e), default=None),
        "routes": counts, "tied_head": tied,
        "bits_per_weight": mean_bits_per_weight(report),
        "bytes_vs_gguf": round(ours / theirs, 4) if theirs else None,
        "runtime_bytes_vs_gguf": round(runtime / theirs, 4) if theirs else None,
        "runtime_layout": "cpu_int8 codes that fit 5 or 6 bits packed at load, all-zero offsets "
                          "dropped (quant/lowbit.py; AVX512-BF16, VBMI and BW, else 8-bit codes)",
        "seconds": round(time.time() - started, 1),
        "quantization_config": qcfg, "tensors": report,
    }
    with atomic.directory(out, kind=KIND, inputs=[src], force=force) as tmp:
        save_file(out_tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        config.save_pretrained(str(tmp))
        gen_config.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / REPORT_NAME).write_text(json.dumps(summary, indent=2) + "\n")
        manifest.write(tmp, {"source": str(src), "architecture": info.architecture, "name": info.name,
                             **want})
    return out
