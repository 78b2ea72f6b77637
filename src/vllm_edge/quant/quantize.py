"""Offline quantizer: a bf16/fp16/fp32 safetensors checkpoint -> a ``cpu_int4`` checkpoint.

Every 2-D weight (the linears, the embedding, the head) becomes ``weight_packed`` /
``weight_scale`` / ``weight_zero`` (see :mod:`.pack`). A head tied to the embedding is
untied into its own tensors, so it never falls back to bf16; when the embedding is
quantized too, the shared table is quantized once and written under both names. The
directory is written atomically, with ``quantization_report.json`` (per-tensor SNR and
bits per weight).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch

from vllm_edge.common import atomic
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.manifest import NAME as MANIFEST_NAME
from vllm_edge.common.manifest import write as write_manifest
from vllm_edge.quant import formats, pack
from vllm_edge.quant.formats import cpu_int4
from vllm_edge.quant.groups import DEFAULT_GROUP, GROUPS  # noqa: F401  (GROUPS re-exported)

# 32 reproduces a llama.cpp Q4_1 source's blocks (asymmetric, 32 wide); 64 halves the scale bytes
REPORT_NAME = "quantization_report.json"
# Bump when the output of a scheme changes, so cached checkpoints are redone.
CONVERTER_VERSION = "quantize/2"
KIND = CONVERTER_VERSION.split("/")[0]
# What the quantizer has been run on end to end (config "architectures").
# EdgeTalkerForCausalLM is a Llama with a smaller (codec-only) head (models/speech/talker.py).
ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Idefics3ForConditionalGeneration", "EdgeTalkerForCausalLM")


class QuantizeError(EdgeError, ValueError):
    """A source or option the quantizer refuses, named."""


def read_source_config(src: Path) -> dict:
    """The source's config.json, checked: it parses, names a supported architecture and
    is not already quantized."""
    path = src / "config.json"
    if not src.is_dir():
        raise QuantizeError(f"{src}: not a model directory")
    check_links(src)
    from vllm_edge.common import model_config

    if not path.exists():
        raise QuantizeError(f"{path}: missing; the source must be a Hugging Face model directory")
    try:
        config = model_config.read(path)
    except model_config.ModelConfigError as exc:
        raise QuantizeError(str(exc)) from None
    if not isinstance(config.get("text_config", {}), dict):
        raise QuantizeError(f"{path}: field text_config={config['text_config']!r}; expected a JSON object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not any(a in ARCHITECTURES for a in archs):
        raise QuantizeError(f"{path}: field architectures={archs!r} is not supported; "
                            f"supported: {', '.join(ARCHITECTURES)}")
    qc = config.get("quantization_config")
    if qc:
        method = qc.get("quant_method") if isinstance(qc, dict) else qc
        raise QuantizeError(f"{path}: field quantization_config says the source is already quantized "
                            f"({method}); quantize its bf16 original instead")
    return config
# the source's import manifest describes the bf16 conversion, not this checkpoint
_SKIP_COPY = {"config.json", "model.safetensors.index.json", REPORT_NAME, MANIFEST_NAME}


def mean_bits_per_weight(report: list[dict]) -> float:
    """The report's bits per weight, weighted by each tensor's size."""
    n = sum(math.prod(r["shape"]) for r in report)
    return round(sum(r["bits_per_weight"] * math.prod(r["shape"]) for r in report) / max(n, 1), 4)


def write_weights(tmp: Path, tensors: dict[str, torch.Tensor], src: Path, skip: set[str]) -> None:
    """One ``model.safetensors`` in the build directory ``tmp``, plus every other file of
    ``src`` but its weights and the names in ``skip`` (tokenizer, templates, generation config)."""
    from safetensors.torch import save_file

    check_links(src)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "model.safetensors").chmod(0o644)
    for f in src.iterdir():
        if f.is_file() and f.name not in skip and f.suffix != ".safetensors":
            shutil.copy2(f, tmp / f.name)


def link_roots(src: Path) -> list[Path]:
    """Where a link in ``src`` may point: inside ``src``, and for a Hugging Face cache
    snapshot (``models--ORG--NAME/snapshots/REV``, whose files link to ``../../blobs``) inside
    that model's cache folder."""
    roots = [src.resolve()]
    if src.parent.name == "snapshots" and src.parent.parent.name.startswith("models--"):
        roots.append(src.parent.parent.resolve())
    return roots


def check_links(src: Path) -> None:
    """Refuse a source whose files are symbolic links out of it: a build copies the
    source's files, and ``notes.txt -> ~/.ssh/id_ed25519`` would land in it."""
    roots = link_roots(src)
    for f in sorted(src.iterdir()):
        if not f.is_symlink():
            continue
        target = f.resolve()
        if not any(target.is_relative_to(r) for r in roots):
            raise QuantizeError(f"{f}: is a symbolic link to {target}, outside the source "
                                "folder; a build copies the source's files, so replace the "
                                "link with the file itself (or remove it)")


def tensor_refs(src: Path) -> Iterator[tuple[str, tuple[Path, str]]]:
    """(name, ref) for every tensor of a safetensors checkpoint directory, in file order;
    :func:`load_ref` reads one. Nothing is loaded here."""

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise QuantizeError(f"{src}: no *.safetensors files")
    for f in files:
        with _open(f) as h:
            names = list(h.keys())
        for name in names:
            yield name, (f, name)


@contextlib.contextmanager
def _open(path: Path, name: str | None = None) -> Iterator[Any]:
    """safe_open with errors that name the file (and tensor): a truncated or garbage file
    otherwise fails with the library's message alone."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as h:
            yield h
    except SafetensorError as exc:
        what = f"{path}" + (f", tensor {name}" if name else "")
        raise QuantizeError(f"{what}: not a readable safetensors file ({exc})") from None


def load_ref(ref: tuple[Path, str]) -> torch.Tensor:
    with _open(ref[0], ref[1]) as h:
        return h.get_tensor(ref[1])


def _shape(ref: tuple[Path, str]) -> tuple[int, ...]:
    with _open(ref[0], ref[1]) as h:
        return tuple(h.get_slice(ref[1]).get_shape())


def _text_config(config: dict) -> dict:
    return config.get("text_config", config)


def _should_quantize(name: str, t_shape: tuple[int, ...], embedding: bool, skip: list[str]) -> bool:
    if len(t_shape) != 2 or not name.endswith(".weight"):
        return False
    module = name[: -len(".weight")]
    if any(module == m or module.startswith(m + ".") for m in skip):
        return False
    if "embed_tokens" in module and not embedding:
        return False
    return t_shape[1] % 2 == 0


# vLLM fuses these sibling projections into one layer with one quantization method,
# so a sibling that must stay bf16 keeps the whole group bf16.
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# An Idefics3-style VLM: what stays bf16 whatever the choice, and why.
VISION_TOWER = "model.vision_model"
VLM_ALWAYS_BF16 = {
    "model.connector": "the connector (modality projection) stays bf16 by design",
    "model.vision_model.embeddings": "not a linear layer (patch convolution and position "
                                     "embedding table)",
}


def vlm_skips(config: dict, quantize_vision: bool | None) -> dict[str, str]:
    """Module prefixes a VLM keeps in bf16, with the reason for each (none for a text model)."""
    if "vision_config" not in config:
        if quantize_vision:
            raise ValueError("quantize_vision applies to a vision-language model; this "
                             "config has no vision_config")
        return {}
    skips = dict(VLM_ALWAYS_BF16)
    if not quantize_vision:
        skips[VISION_TOWER] = "quantize_vision=false: the vision tower's linears stay bf16"
    return skips


def unsupported_shapes(shapes: dict[str, tuple[int, ...]], group: int,
                       candidates: list[str]) -> dict[str, str]:
    """Weights tinygemm cannot take, with their fused siblings: name -> reason."""
    out: dict[str, str] = {}
    for name in candidates:
        n, k = shapes[name]
        ok, why = pack.supports(n, k, group)
        if not ok:
            out[name] = f"unsupported shape {n}x{k}: {why}"
    for name, why in list(out.items()):
        base = name[: -len(".weight")]
        head, _, last = base.rpartition(".")
        for group_names in FUSED_SIBLINGS:
            if last in group_names:
                for sib in group_names:
                    sib_name = f"{head}.{sib}.weight"
                    if sib_name in shapes and sib_name not in out:
                        out[sib_name] = f"fused with {base}, which has an {why}"
    return out


def snr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    ref = ref.float()
    noise = (ref - approx.float()).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)


def quantize_model(src_dir: str | Path, dst_dir: str | Path, scheme: str = cpu_int4.NAME,
                   group: int = DEFAULT_GROUP, *, quantize_embedding: bool = True,
                   modules_to_not_convert: list[str] | None = None,
                   quantize_vision: bool | None = None,
                   progress: bool = True, manifest: dict | None = None, force: bool = False) -> Path:
    """Write a checkpoint of ``src_dir`` in the weight format ``scheme`` (a name in
    :mod:`vllm_edge.quant.formats`) to ``dst_dir`` (atomically). A format that cannot store
    the input embedding (``gptq``: vLLM's GPTQ reads none) keeps it in bf16; the untied head
    is quantized.

    Every output carries a manifest (``vllm_edge_manifest.json``: converter, scheme, group,
    source), written inside the same atomic rename; ``manifest`` adds fields to it. An
    existing ``dst`` that is not a quantizer output is refused unless ``force``.

    A vision-language model (a config with ``vision_config``; Idefics3 naming) keeps its
    connector and vision embeddings in bf16, and its vision tower's linears too unless
    ``quantize_vision``. Any weight tinygemm cannot take stays bf16 with its fused
    siblings. All of these are listed in ``modules_to_not_convert`` and, with reasons,
    in the report's ``kept_bf16``.
    """
    from tqdm import tqdm

    if scheme not in formats.names():
        raise QuantizeError(f"scheme {scheme!r} is not implemented; available: "
                            f"{', '.join(formats.names())}")
    fmt = formats.get(scheme)
    if group not in fmt.groups:
        raise QuantizeError(f"group {group} is not supported; use one of {fmt.groups}")
    src, dst = Path(src_dir).expanduser(), Path(dst_dir).expanduser()
    atomic.check_destination(dst, kind=KIND, inputs=[src], force=force)
    config = read_source_config(src)
    skip = list(modules_to_not_convert or [])
    refs = dict(tensor_refs(src))
    if not fmt.quantizes_embedding:
        quantize_embedding = False
    reasons = {m: "modules_to_not_convert given by the caller" for m in skip}
    vlm = vlm_skips(config, quantize_vision)
    if vlm and not fmt.vision:
        raise ValueError(f"{src}: a vision-language model supports scheme "
                         f"{', '.join(f.name for f in formats.all_formats() if f.vision)} only")
    reasons.update(vlm)
    skip = list(dict.fromkeys([*skip, *vlm]))
    text_cfg = _text_config(config)
    tied = bool(text_cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    embed_name = next((n for n in refs if n.endswith("embed_tokens.weight")), None)
    head_name = "lm_head.weight"
    untied = False
    if head_name not in refs and embed_name is not None and (tied or "lm_head" not in str(refs)):
        refs[head_name] = refs[embed_name]
        untied = True

    shapes = {n: _shape(r) for n, r in refs.items()}
    if fmt.check_shapes:  # fail before any work on a shape the format cannot store
        fmt.check({n: s for n, s in shapes.items()
                   if _should_quantize(n, s, quantize_embedding, skip)}, group)
    elif vlm:
        # Linears tinygemm cannot take stay bf16 (vLLM would otherwise run them through
        # the slow dequantize fallback). Embedding-like tables are never linears here.
        cand = [n for n, s in shapes.items() if _should_quantize(n, s, quantize_embedding, skip)
                and "embed_tokens" not in n and n != head_name]
        for name, why in unsupported_shapes(shapes, group, cand).items():
            module = name[: -len(".weight")]
            skip.append(module)
            reasons[module] = why
    kept = [{"name": n, "shape": list(s), "reason": next(
                (why for m, why in reasons.items() if n[: -len(".weight")] == m
                 or n.startswith(m + ".")), _default_reason(n, s, quantize_embedding))}
            for n, s in sorted(shapes.items())
            if len(s) == 2 and n.endswith(".weight")
            and not _should_quantize(n, s, quantize_embedding, skip)]
    started = time.time()
    out: dict[str, torch.Tensor] = {}
    report: list[dict[str, Any]] = []
    names = sorted(refs)
    encode = fmt.encoder()
    # An untied head is the embedding's source tensor under a second name. Scheme, group
    # and clipping are fixed for the whole call, so when both names are quantized the
    # result is identical: encode it once and write it under both (the tensors it holds
    # are in ``out`` already, so keeping them here costs no memory).
    shared = {r for r, n in Counter(refs.values()).items() if n > 1}
    done: dict[tuple[Path, str], tuple[dict[str, torch.Tensor], float, float]] = {}
    with tqdm(total=len(names), desc=f"quantize {scheme} g{group}", unit="tensor",
              disable=not progress) as bar:
        for name in names:
            t = load_ref(refs[name])
            if not _should_quantize(name, tuple(t.shape), quantize_embedding, skip) or not t.is_floating_point():
                out[name] = t.contiguous()
                bar.update(1)
                continue
            base = name[: -len(".weight")]
            if refs[name] in done:
                tensors, snr, bpw = done[refs[name]]
                # safetensors refuses to write tensors that share storage
                tensors = {suffix: v.clone() for suffix, v in tensors.items()}
            else:
                tensors, deq = encode(t, group)
                snr = round(snr_db(t, deq), 3)
                bits = sum(v.numel() * v.element_size() * 8 for v in tensors.values())
                bpw = round(bits / t.numel(), 4)
                if refs[name] in shared:
                    done[refs[name]] = (tensors, snr, bpw)
                del deq
            out.update({f"{base}.{suffix}": v for suffix, v in tensors.items()})
            report.append({
                "name": name, "shape": list(t.shape), "snr_db": snr, "bits_per_weight": bpw,
                "tied_head_copy": untied and name == head_name,
            })
            del t, tensors
            bar.update(1)

    qcfg = fmt.config(group, quantize_embedding=quantize_embedding, modules_to_not_convert=skip)
    if vlm:
        qcfg["quantize_vision"] = bool(quantize_vision)
    new_config = dict(config)
    new_config["quantization_config"] = qcfg
    if untied or tied:
        new_config["tie_word_embeddings"] = False
        if "text_config" in new_config:
            new_config["text_config"] = {**new_config["text_config"], "tie_word_embeddings": False}
    n_q = sum(math.prod(r["shape"]) for r in report)
    summary = {
        "scheme": scheme, "group_size": group, "source": str(src.resolve()),
        "seconds": round(time.time() - started, 1),
        "clip_ratios": list(pack.DEFAULT_CLIP_RATIOS),
        "head_untied": untied,
        "quantized_weights": n_q,
        "bits_per_weight": mean_bits_per_weight(report),
        "snr_db_min": min((r["snr_db"] for r in report), default=None),
        "snr_db_mean": round(sum(r["snr_db"] for r in report) / max(len(report), 1), 3),
        "quantization_config": qcfg,
        "kept_bf16": kept,
        "tensors": report,
    }
    build_manifest = {"converter": CONVERTER_VERSION, "source": str(src.resolve()),
                      "scheme": scheme, "group_size": group, **(manifest or {})}
    with atomic.directory(dst, kind=KIND, inputs=[src], force=force) as tmp:
        write_weights(tmp, out, src, _SKIP_COPY)
        (tmp / "config.json").write_text(json.dumps(new_config, indent=2) + "\n")
        (tmp / REPORT_NAME).write_text(json.dumps(summary, indent=2) + "\n")
        for sidecar, content in fmt.sidecar_files(qcfg).items():
            (tmp / sidecar).write_text(json.dumps(content, indent=2) + "\n")
        write_manifest(tmp, build_manifest)
    return dst


def _default_reason(name: str, shape: tuple[int, ...], embedding: bool) -> str:
    if "embed_tokens" in name and not embedding:
        return "input embedding kept (quantize_embedding=false)"
    return f"input size {shape[1]} is odd"
