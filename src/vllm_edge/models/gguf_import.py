"""GGUF -> bf16 safetensors directory that vLLM loads.

transformers dequantizes the GGUF (it needs ``gguf`` and ``accelerate``); we
clear its quantizer, save config, tokenizer and chat template, and write a
manifest with the source sha256 and the converter version. The output
directory appears only when complete (atomic rename); re-running on the same
source is a no-op.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from vllm_edge.common import atomic, manifest
from vllm_edge.common.errors import EdgeError

logger = logging.getLogger("vllm_edge.models")

# Bump when the conversion output changes, so cached conversions are redone.
CONVERTER_VERSION = "gguf-import/1"
KIND = CONVERTER_VERSION.split("/")[0]

# Architectures whose conversion we have checked. transformers mis-converts
# others (gemma3 gives degenerate text where llama.cpp is correct: docs/guide/llama-cpp.md, "Gemma 3 270M").
SUPPORTED_ARCHS = {"llama"}
# What we found for refused architectures we tried (docs/guide/llama-cpp.md).
ARCH_FINDINGS = {
    "gemma3": (
        "Checked against llama.cpp on gemma-3-270m Q4_K_M: transformers' dequantized weights and "
        "config agree with llama.cpp on an f32 copy of the file (teacher-forced top-1 1.000, max "
        "|logit difference| 0.03 over 256 positions that start with <bos>), but "
        "the tokenizer transformers builds from the GGUF does not add <bos> "
        "(tokenizer.ggml.add_bos_token is true), and without it the model degenerates "
        "('The capital of France is France. The The The ...'). The file also has no chat template. "
        "Until the tokenizer is fixed and verified, gemma3 is refused."
    ),
}
GGUF_MAGIC = b"GGUF"


class GgufImportError(EdgeError):
    """A GGUF that cannot be imported; the message names the file and the reason."""


@dataclass
class GgufInfo:
    path: Path
    architecture: str
    name: str | None
    tensor_count: int


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def inspect_gguf(path: str | os.PathLike) -> GgufInfo:
    """Validate a GGUF file and read its architecture, with clear errors."""
    path = Path(path)
    if not path.exists():
        raise GgufImportError(f"{path}: no such file")
    if not path.is_file():
        raise GgufImportError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise GgufImportError(f"{path}: not a GGUF file (bad magic {head[:4]!r})")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise GgufImportError(f"{path}: unsupported GGUF version {version}")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises assorted errors on truncation
        raise GgufImportError(f"{path}: unreadable or truncated GGUF ({type(exc).__name__}: {exc})") from None

    def field_str(key: str) -> str | None:
        fld = reader.fields.get(key)
        if fld is None:
            return None
        return bytes(fld.parts[fld.data[0]]).decode("utf-8", "replace")

    arch = field_str("general.architecture")
    if arch is None:
        raise GgufImportError(f"{path}: missing general.architecture")
    # A truncated file can still parse its header: check every tensor's data lies inside it.
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise GgufImportError(
                f"{path}: truncated: tensor {t.name} ends at byte {end} but the file has {size}"
            )
    return GgufInfo(path=path, architecture=arch, name=field_str("general.name"), tensor_count=len(reader.tensors))


def import_gguf(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, progress: bool = True) -> Path:
    """Convert ``src`` (GGUF) into a bf16 safetensors model directory ``out``."""
    src, out = Path(src).resolve(), Path(out).expanduser().resolve()
    info = inspect_gguf(src)
    if info.architecture not in SUPPORTED_ARCHS:
        raise GgufImportError(
            f"{src}: unsupported architecture {info.architecture!r} "
            f"(supported: {', '.join(sorted(SUPPORTED_ARCHS))}). transformers' conversion of "
            "other architectures is not verified against llama.cpp, and for gemma3 it is known "
            "to produce a wrong model. " + ARCH_FINDINGS.get(info.architecture, "")
        )
    atomic.check_destination(out, kind=KIND, inputs=[src], force=force)
    source_sha = sha256_file(src)
    with atomic.lock(out):
        why = manifest.mismatch(out, {"source_sha256": source_sha, "converter": CONVERTER_VERSION})
        if not force and why is None:
            logger.info("%s is already converted from %s", out, src.name)
            return out
        if out.exists() and why:
            logger.warning("%s; converting again", why)
        return _convert(src, out, info, source_sha, force=force, progress=progress)


def _convert(src: Path, out: Path, info: GgufInfo, source_sha: str, *, force: bool,
             progress: bool) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = ["tokenizer", "weights (dequantize)", "save"]
    bar = _progress(len(steps), f"import {src.name}", progress)
    with atomic.directory(out, kind=KIND, inputs=[src], force=force) as tmp:
        bar.set_postfix_str(steps[0])
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        model = AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.bfloat16
        )
        bar.update(1)
        bar.set_postfix_str(steps[2])
        # The weights are dequantized now: the saved model must not claim a GGUF quantizer.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.torch_dtype = torch.bfloat16
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if getattr(tok, "chat_template", None) is None:
            raise GgufImportError(f"{src}: the GGUF carries no chat template (tokenizer.chat_template)")
        manifest.write(
            tmp,
            {
                "source": str(src),
                "source_sha256": source_sha,
                "architecture": info.architecture,
                "name": info.name,
                "converter": CONVERTER_VERSION,
                "dtype": "bfloat16",
            },
        )
        bar.update(1)
    bar.close()
    return out


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="step")
