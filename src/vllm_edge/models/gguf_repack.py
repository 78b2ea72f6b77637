"""GGUF (the families of :mod:`.gguf_families`) -> a ``cpu_int4`` g32 checkpoint, with 4-bit tensors repacked, not requantized.

Every 2-D weight takes one route, recorded per tensor in ``repack_report.json``:

- ``repack``: Q4_0, Q4_1 and Q4_K keep their integer codes; only the per-group scale and
  offset are rounded to bf16 (:mod:`vllm_edge.quant.repack`, which states the bound). Each
  repacked tensor is checked against gguf's own dequantization before it is written, and the
  worst ratio to the bound is reported.
- ``requantize``: a format that does not map (Q5_0, Q6_K, Q8_0, F16, ...) is dequantized with
  gguf, rounded to bf16 as the bf16 import does, and quantized by the same quantizer as
  ``vllm-edge quantize`` (its SNR against gguf's dequantization is reported);
- ``bf16``: kept as gguf's dequantization rounded to bf16 (``requantize=False``, and the
  embedding with ``keep_embedding``). vLLM fuses q/k/v and gate/up into one layer with one
  method, so a bf16 tensor takes its fused siblings to bf16 too.

Norms and biases are written in bf16 (Gemma's norms less the 1 its GGUF adds). The q/k rows
are put back in HF order for the families whose rope llama.cpp's convert permuted (Llama). The config and tokenizer come from transformers' reading of the
GGUF metadata (no weights), as in :mod:`.gguf_import`; the header is validated there first
by our own bounded reader.
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
from vllm_edge.quant.formats import cpu_int4

logger = logging.getLogger("vllm_edge.models")

# Bump when the output changes, so cached repacks are redone.
CONVERTER_VERSION = "gguf-repack/1"
KIND = CONVERTER_VERSION.split("/")[0]
REPORT_NAME = "repack_report.json"
GROUP = 32

_GLOBAL = {g: hf for g, (hf, _) in gguf_families.GLOBAL.items()}
# vLLM loads these into one layer each (qkv_proj, gate_up_proj): one method for the group
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


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
                tied: bool) -> dict[str, tuple[str, str]]:
    """HF weight name -> (route, why) for every 2-D weight, given its GGUF type name.

    Pure: the routes follow from the types and the options alone."""
    from vllm_edge.quant.repack import FORMATS

    routes: dict[str, tuple[str, str]] = {}
    for name, t in types.items():
        if name == "model.embed_tokens.weight" and keep_embedding:
            routes[name] = ("bf16", "keep_embedding: the token embedding stays bf16"
                            + (" (the tied head reads it)" if tied else ""))
        elif t in FORMATS:
            routes[name] = ("repack", f"{t} maps onto cpu_int4 g32")
        elif requantize:
            routes[name] = ("requantize", f"{t} does not map onto 4-bit codes; quantized again at g32")
        else:
            routes[name] = ("bf16", f"{t} does not map onto 4-bit codes; requantize=False keeps it bf16")
    for name, (route, why) in list(routes.items()):
        if route != "bf16":
            continue
        for sib in _fused_group(name):
            if sib != name and sib in routes and routes[sib][0] != "bf16":
                routes[sib] = ("bf16", f"fused with {name[: -len('.weight')]}, which stays bf16 "
                                       f"({types[name]})")
    return routes


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
    """The manifest fields a repack of that source with those options carries (the cache key)."""
    return {"source_sha256": source_sha256, "converter": CONVERTER_VERSION, "scheme": cpu_int4.NAME,
            "group_size": GROUP, "requantize": requantize, "keep_embedding": keep_embedding}


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

    from vllm_edge.quant import pack, repack
    from vllm_edge.quant.formats.cpu_int4 import quantization_config as cpu_int4_config
    from vllm_edge.quant.quantize import mean_bits_per_weight, snr_db

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
                         tied=tied)
    # llama.cpp permuted the q/k rows of rope-permuted families only
    rows_order = {"self_attn.q_proj": heads, "self_attn.k_proj": kv_heads} if fam.rope_permuted else {}

    out_tensors: dict[str, torch.Tensor] = {}
    report: list[dict[str, Any]] = []
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
        ref = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(n, k)
        if route == "repack":
            raw = torch.from_numpy(np.array(t.data).view(np.uint8).reshape(n, -1))
            try:
                r = repack.decode(t.tensor_type.name, raw, k, g)
                entry["max_error_over_bound"] = round(repack.check(r, torch.from_numpy(ref), g), 6)
            except repack.RepackError as exc:
                raise GgufRepackError(f"{src}: {exc}") from None
            if order is not None:
                r = r.take_rows(order)
            parts = r.tensors()
        else:
            w = torch.from_numpy(ref)
            if order is not None:
                w = w[order]
            w = w.to(torch.bfloat16)
            if route == "bf16":
                out_tensors[name] = w.contiguous()
                parts = None
            else:
                q, scale, zero = pack.quantize(w, GROUP)
                parts = {"weight_packed": pack.pack_nibbles(q), "weight_scale": scale.contiguous(),
                         "weight_zero": zero.contiguous()}
                deq = pack.dequantize_plain(parts["weight_packed"], scale, zero, GROUP)
                ref_rows = torch.from_numpy(ref)[order] if order is not None else torch.from_numpy(ref)
                entry["snr_db"] = round(snr_db(ref_rows, deq), 3)
        if parts is not None:
            out_tensors.update({f"{base}.{s}": v for s, v in parts.items()})
            bits = sum(v.numel() * v.element_size() * 8 for v in parts.values())
        else:
            bits = n * k * 16
        entry["bits_per_weight"] = round(bits / (n * k), 4)
        report.append(entry)

    embed = routes["model.embed_tokens.weight"][0]
    if tied and embed != "bf16":
        # An untied head runs from the packed table; tied to a bf16 table it would stay bf16.
        for s in ("weight_packed", "weight_scale", "weight_zero"):
            out_tensors[f"lm_head.{s}"] = out_tensors[f"model.embed_tokens.{s}"].clone()
        report.append({**next(e for e in report if e["name"] == "model.embed_tokens.weight"),
                       "name": "lm_head.weight", "why": "the tied head, untied: a copy of the embedding"})
    skip = sorted({n[: -len(".weight")] for n, (r, _) in routes.items()
                   if r == "bf16" and n != "model.embed_tokens.weight"})
    qcfg = cpu_int4_config(GROUP, quantize_embedding=embed != "bf16", modules_to_not_convert=skip)
    config.quantization_config = qcfg
    config.architectures = [fam.hf_class]
    config.tie_word_embeddings = tied and embed == "bf16"
    config.dtype = torch.bfloat16

    counts: dict[str, int] = {}
    for e in report:
        counts[e["route"]] = counts.get(e["route"], 0) + 1
    summary = {
        "source": str(src), "gguf_types": sorted({e["gguf_type"] for e in report}),
        "group_size": GROUP, "requantize": want["requantize"], "keep_embedding": want["keep_embedding"],
        "bound": {"eps": repack.EPS, "per_weight": "|ours - gguf| <= eps * (|q - 8| |scale| + |zero|), "
                  "scale and zero exact (quant/repack.py)"},
        "max_error_over_bound": max((e["max_error_over_bound"] for e in report
                                     if "max_error_over_bound" in e), default=None),
        "routes": counts, "tied_head": tied,
        "bits_per_weight": mean_bits_per_weight(report),
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
