"""A GPTQ (or AutoAWQ GEMM) checkpoint directory -> a ``cpu_int4`` checkpoint, with the 4-bit
codes kept.

Every quantized linear (``<m>.qweight``, ``qzeros``, ``scales``, ``g_idx``) is repacked by
:mod:`vllm_edge.quant.gptq_repack` at the GPTQ group size (or split into the largest cpu_int4
group dividing it), checked against GPTQ's own value ``scale * (q - zero)`` before it is
written, and its worst error over the bound goes to ``repack_report.json``. Everything else
(embedding, norms, biases, a head GPTQ left unquantized) is copied as stored; a plain 2-D
weight other than the embedding is listed in ``modules_to_not_convert`` so cpu_int4 keeps it
as it is. Config, tokenizer and other small files are copied; ``config.json`` gets the
cpu_int4 ``quantization_config``.

Refused before any output: 8-bit or other non-4-bit GPTQ, per-module ``dynamic`` overrides,
an unknown ``checkpoint_format``, a fused layer (q/k/v, gate/up) whose parts disagree on being
quantized, and, per tensor, an act-order ``g_idx`` and a group cpu_int4 cannot represent.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from vllm_edge.common import atomic
from vllm_edge.common import manifest as manifest_file
from vllm_edge.common.errors import EdgeError
from vllm_edge.quant.formats import cpu_int4

logger = logging.getLogger("vllm_edge.models")

# Bump when the output changes.
CONVERTER_VERSION = "gptq-repack/1"
KIND = CONVERTER_VERSION.split("/")[0]
REPORT_NAME = "repack_report.json"
_PARTS = ("qweight", "qzeros", "scales", "g_idx")
# vLLM loads each of these into one layer with one method
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_SKIP_COPY = {"config.json", "quantize_config.json", "model.safetensors.index.json", REPORT_NAME,
              "quantization_report.json", manifest_file.NAME}


class GptqSourceError(EdgeError, ValueError):
    """A source directory that is not a GPTQ checkpoint we can repack; the message names it."""


def read_gptq_config(src: Path) -> tuple[dict, dict]:
    """(config.json, its GPTQ quantization settings), checked. The settings come from
    ``quantization_config`` or, for older exports, ``quantize_config.json``."""
    path = src / "config.json"
    if not src.is_dir():
        raise GptqSourceError(f"{src}: not a model directory")
    from vllm_edge.common import model_config

    if not path.exists():
        raise GptqSourceError(f"{path}: missing; the source must be a Hugging Face model directory")
    try:
        config = model_config.read(path)
    except model_config.ModelConfigError as exc:
        raise GptqSourceError(str(exc)) from None
    qc = config.get("quantization_config")
    where = f"{path}: quantization_config"
    if qc is None and (src / "quantize_config.json").is_file():
        where = f"{src / 'quantize_config.json'}:"
        try:
            qc = json.loads((src / "quantize_config.json").read_text())
        except (OSError, ValueError) as exc:
            raise GptqSourceError(f"{src / 'quantize_config.json'}: not valid JSON ({exc})") from None
        qc = {"quant_method": "gptq", **qc} if isinstance(qc, dict) else qc
    method = str(qc.get("quant_method", "")).lower() if isinstance(qc, dict) else None
    if method == "awq":
        return config, _awq_settings(qc, where)
    if method != "gptq":
        raise GptqSourceError(f"{path}: not a GPTQ or AWQ checkpoint (quantization method "
                              f"{qc.get('quant_method') if isinstance(qc, dict) else qc!r}); "
                              "a bf16 model is quantized with `vllm-edge quantize`")
    if qc.get("bits") != 4:
        raise GptqSourceError(f"{where} bits={qc.get('bits')!r}; cpu_int4 holds 4-bit codes only")
    if qc.get("dynamic"):
        raise GptqSourceError(f"{where} dynamic (per-module overrides) is set; the repack takes one "
                              "bits/group for the whole model")
    from vllm_edge.quant.gptq_repack import FORMATS

    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in FORMATS or fmt == "awq":
        raise GptqSourceError(f"{where} checkpoint_format={fmt!r}; repackable: gptq, gptq_v2 "
                              "(an AWQ checkpoint says quant_method awq)")
    if not isinstance(qc.get("sym", True), bool):
        raise GptqSourceError(f"{where} sym={qc.get('sym')!r}; expected true or false")
    return config, {"group_size": qc.get("group_size"), "sym": qc.get("sym", True),
                    "checkpoint_format": fmt, "desc_act": bool(qc.get("desc_act", False))}


def _awq_settings(qc: dict, where: str) -> dict:
    """AutoAWQ's GEMM checkpoints (``version: gemm``, with zero points): the same settings as a
    GPTQ one, with ``checkpoint_format`` ``awq``."""
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise GptqSourceError(f"{where} bits={bits!r}; cpu_int4 holds 4-bit codes only")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise GptqSourceError(f"{where} version={version!r}; only AWQ's GEMM packing is repacked "
                              "(GEMV and Marlin exports pack their words differently)")
    if qc.get("zero_point", True) is not True:
        raise GptqSourceError(f"{where} zero_point={qc.get('zero_point')!r}; AWQ without zero "
                              "points is not repacked")
    group = qc.get("group_size", qc.get("q_group_size"))
    return {"group_size": group, "sym": False, "checkpoint_format": "awq", "desc_act": False}


def _fused_siblings(base: str) -> list[str]:
    head, _, last = base.rpartition(".")
    for group in _FUSED:
        if last in group:
            return [f"{head}.{s}" for s in group]
    return [base]


def repack_gptq(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
                progress: bool = True, manifest: dict | None = None) -> Path:
    """Write the cpu_int4 checkpoint of GPTQ directory ``src`` to ``out`` (atomically, with a
    manifest, which ``manifest`` adds fields to, and ``repack_report.json``). An existing ``out`` that is not a GPTQ repack is
    refused unless ``force``; nothing is written when any tensor is refused."""
    import torch
    from tqdm import tqdm

    from vllm_edge.quant import gptq_repack
    from vllm_edge.quant.formats.cpu_int4 import quantization_config as cpu_int4_config
    from vllm_edge.quant.quantize import (
        QuantizeError,
        load_ref,
        mean_bits_per_weight,
        tensor_refs,
        write_weights,
    )

    src, out = Path(src).expanduser().resolve(), Path(out).expanduser().resolve()
    config, gq = read_gptq_config(src)
    atomic.check_destination(out, kind=KIND, inputs=[src], force=force)
    started = time.time()
    try:
        refs = dict(tensor_refs(src))
    except QuantizeError as exc:
        raise GptqSourceError(str(exc)) from None
    modules = sorted(n[: -len(".qweight")] for n in refs if n.endswith(".qweight"))
    if not modules:
        raise GptqSourceError(f"{src}: no *.qweight tensors; not a GPTQ checkpoint")
    handled = {f"{m}.{p}" for m in modules for p in _PARTS}
    plain = sorted(n[: -len(".weight")] for n in refs
                   if n.endswith(".weight") and n not in handled and "embed_tokens" not in n
                   and len(_shape(refs[n])) == 2)
    for base in modules:
        odd = [s for s in _fused_siblings(base) if s in plain]
        if odd:
            raise GptqSourceError(f"{src}: {base} is GPTQ-quantized but its fused sibling {odd[0]} is "
                                  "not; vLLM loads them into one layer with one method")
    # the model's one cpu_int4 group: per-channel takes the largest dividing every K
    ks = [gptq_repack.in_features(_shape(refs[f"{m}.qweight"]), gq["checkpoint_format"]) for m in modules]
    try:
        target = gptq_repack.target_group(gq["group_size"], ks, str(src))
    except gptq_repack.GptqRepackError as exc:
        raise GptqSourceError(str(exc)) from None

    out_tensors: dict[str, torch.Tensor] = {}
    report: list[dict[str, Any]] = []
    for name in tqdm(sorted(refs), desc=f"repack {src.name}", unit="tensor", disable=not progress):
        if name in handled:
            continue
        out_tensors[name] = load_ref(refs[name]).contiguous()
    for base in tqdm(modules, desc=f"repack {src.name}", unit="linear", disable=not progress):
        t = {p: load_ref(refs[f"{base}.{p}"]) for p in _PARTS if f"{base}.{p}" in refs}
        try:
            r = gptq_repack.decode(t, group=gq["group_size"], sym=gq["sym"],
                                   checkpoint_format=gq["checkpoint_format"], target=target, name=base)
            ref = gptq_repack.dequantize_gptq(t, group=gq["group_size"],
                                              checkpoint_format=gq["checkpoint_format"])
            ratio = gptq_repack.check(r, ref, base)
        except gptq_repack.GptqRepackError as exc:
            raise gptq_repack.GptqRepackError(f"{src}: {exc}") from None
        parts = r.tensors()
        out_tensors.update({f"{base}.{s}": v for s, v in parts.items()})
        n, k = r.codes.shape
        bits = sum(v.numel() * v.element_size() * 8 for v in parts.values())
        report.append({"name": f"{base}.weight", "shape": [n, k], "gptq_group": gq["group_size"],
                       "group_size": target, "max_error_over_bound": round(ratio, 6),
                       "bits_per_weight": round(bits / (n * k), 4)})
        del t, r, ref

    qcfg = cpu_int4_config(target, quantize_embedding=False, modules_to_not_convert=plain)
    new_config = {**config, "quantization_config": qcfg}
    summary = {
        "source": str(src), "gptq": gq, "group_size": target,
        "split": target != gq["group_size"],
        "bound": {"eps": gptq_repack.EPS, "per_weight": "|ours - gptq| <= eps * (|q - 8| |scale| + "
                  "|zero|), scale and zero exact (quant/gptq_repack.py)"},
        "max_error_over_bound": max((e["max_error_over_bound"] for e in report), default=None),
        "repacked": len(report), "kept_as_stored": plain,
        "bits_per_weight": mean_bits_per_weight(report),
        "seconds": round(time.time() - started, 1),
        "quantization_config": qcfg, "tensors": report,
    }
    with atomic.directory(out, kind=KIND, inputs=[src], force=force) as tmp:
        write_weights(tmp, out_tensors, src, _SKIP_COPY)
        (tmp / "config.json").write_text(json.dumps(new_config, indent=2) + "\n")
        (tmp / REPORT_NAME).write_text(json.dumps(summary, indent=2) + "\n")
        manifest_file.write(tmp, {"converter": CONVERTER_VERSION, "source": str(src),
                                  "scheme": cpu_int4.NAME, "group_size": target,
                                  "gptq_group_size": gq["group_size"], "sym": gq["sym"],
                                  "checkpoint_format": gq["checkpoint_format"], **(manifest or {})})
    return out


def _shape(ref) -> tuple[int, ...]:
    from vllm_edge.quant.quantize import _shape as shape

    return shape(ref)
