"""GGUF -> bf16 safetensors directory that vLLM loads.

transformers dequantizes the GGUF (it needs ``gguf`` and ``accelerate``); we
clear its quantizer, save config, tokenizer and chat template, and write a
manifest with the source sha256 and the converter version. The output
directory appears only when complete (atomic rename); re-running on the same
source is a no-op.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from vllm_edge.common import atomic, manifest
from vllm_edge.common.errors import EdgeError
from vllm_edge.models import gguf_families

logger = logging.getLogger("vllm_edge.models")

# Bump when the conversion output changes, so cached conversions are redone.
CONVERTER_VERSION = "gguf-import/2"
KIND = CONVERTER_VERSION.split("/")[0]

# The architectures we take are gguf_families.FAMILIES (one list for import, repack and docs).
# What we found for refused architectures we tried, quoted when one is refused.
ARCH_FINDINGS: dict[str, str] = {}
GGUF_MAGIC = b"GGUF"
# GGUF metadata value types (gguf.GGUFValueType) of a fixed size; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_GGML_MAX_DIMS = 4
# What the parsed metadata may cost in memory: a value's file bytes are no bound (a uint8
# array element is one byte on disk and a pointer plus an object in a Python list). A real
# tokenizer (256k tokens with scores and types, 500k merges) costs well under 100 MiB.
MAX_METADATA_MEMORY = 256 << 20
_SCALAR_COST = 40  # a list slot and an int or float object
_STRING_COST = 57  # a list slot and an empty str; its characters come on top


class GgufImportError(EdgeError):
    """A GGUF that cannot be imported; the message names the file and the reason."""


class GgufTensor(NamedTuple):
    dims: tuple[int, ...]  # in GGUF order: the fastest-moving (a row's length) first
    ggml_type: int
    n_bytes: int


@dataclass
class GgufInfo:
    path: Path
    architecture: str
    name: str | None
    tensor_count: int
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    tensors: dict[str, GgufTensor] = field(default_factory=dict, repr=False)


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
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            metadata, tensors = _Header(path, buf).read()
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufImportError(f"{path}: missing general.architecture")
    name = metadata.get("general.name")
    return GgufInfo(path=path, architecture=arch, name=name if isinstance(name, str) else None,
                    tensor_count=len(tensors), metadata=metadata, tensors=tensors)


class _Header:
    """A bounded walk of a GGUF's metadata and tensor table. Every length and count is checked
    against the bytes left before it is used: gguf's own reader trusts them, and on a huge
    array count in a truncated file loops without end while its memory grows."""

    def __init__(self, path: Path, buf: mmap.mmap) -> None:
        self.path, self.buf, self.pos = path, buf, 8
        self.memory = 0  # what the metadata read so far costs, estimated

    def spend(self, n: int, what: str) -> None:
        self.memory += n
        if self.memory > MAX_METADATA_MEMORY:
            raise self.fail(f"{what} would take the metadata over {MAX_METADATA_MEMORY >> 20} MiB "
                            "of memory (MAX_METADATA_MEMORY)")

    def fail(self, why: str) -> GgufImportError:
        return GgufImportError(f"{self.path}: unreadable or truncated GGUF: {why}")

    def room(self, n: int, what: str) -> None:
        if n > len(self.buf) - self.pos:
            raise self.fail(f"{what} at byte {self.pos} needs {n} bytes, but the file ends at "
                            f"byte {len(self.buf)}")

    def take(self, n: int, what: str) -> int:
        self.room(n, what)
        self.pos += n
        return self.pos - n

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"{what} (its length)")
        start = self.take(n, what)
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == 8:
            return self.string(what)
        if vtype != 9:
            raise self.fail(f"{what} has unknown value type {vtype}")
        etype = self.unpack("<I", f"{what} (its element type)")
        count = self.unpack("<Q", f"{what} (its length)")
        if etype in _SCALARS:
            code = _SCALARS[etype][1]
            self.room(count * struct.calcsize(code), f"{what} ({count} values)")
            self.spend(count * _SCALAR_COST, f"{what} ({count} values)")
            start = self.take(count * struct.calcsize(code), f"{what} ({count} values)")
            return list(struct.unpack_from(f"<{count}{code}", self.buf, start))
        if etype == 8:
            self.room(count * 8, f"{what} ({count} strings)")  # each at least its 8-byte length
            self.spend(count * _STRING_COST, f"{what} ({count} strings)")
            out = []
            for i in range(count):
                out.append(self.string(f"{what}[{i}]"))
                self.spend(len(out[-1]), f"{what}[{i}]")
            return out
        raise self.fail(f"{what} is an array of type {etype}, which is not supported")

    def read(self) -> tuple[dict[str, Any], dict[str, GgufTensor]]:
        n_tensors = self.unpack("<Q", "the tensor count")
        n_kv = self.unpack("<Q", "the metadata count")
        self.room(n_kv * 13, f"{n_kv} metadata entries")  # key length, type, one byte
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            if key in metadata:
                raise self.fail(f"metadata {key} appears twice")
            metadata[key] = self.value(self.unpack("<I", f"metadata {key} (its type)"), f"metadata {key}")
        self.room(n_tensors * 24, f"{n_tensors} tensor entries")  # name length, dims, type, offset
        table = []
        for i in range(n_tensors):
            name = self.string(f"tensor name #{i}")
            n_dims = self.unpack("<I", f"tensor {name} (its dimension count)")
            if not 1 <= n_dims <= _GGML_MAX_DIMS:
                raise self.fail(f"tensor {name} has {n_dims} dimensions (1 to {_GGML_MAX_DIMS} allowed)")
            start = self.take(8 * n_dims, f"tensor {name} (its shape)")
            dims = struct.unpack_from(f"<{n_dims}Q", self.buf, start)
            ggml_type = self.unpack("<I", f"tensor {name} (its type)")
            table.append((name, dims, ggml_type, self.unpack("<Q", f"tensor {name} (its offset)")))
        return metadata, self.tensors(table, metadata.get("general.alignment", 32))

    def tensors(self, table: list, alignment: Any) -> dict[str, GgufTensor]:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
            raise self.fail(f"general.alignment={alignment!r} is not a power of two")
        data_start = -(-self.pos // alignment) * alignment
        size = len(self.buf)
        out: dict[str, GgufTensor] = {}
        prev_name, prev_end = None, 0  # offsets relative to data_start
        for name, dims, ggml_type, offset in table:
            if name in out:
                raise self.fail(f"tensor {name} appears twice")
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError):
                raise self.fail(f"tensor {name} has unknown ggml type {ggml_type}") from None
            if dims[0] % block:
                raise self.fail(f"tensor {name}: a row of {dims[0]} values is not a whole number "
                                f"of blocks of {block}")
            n_bytes = math.prod(dims) // block * type_size
            end = data_start + offset + n_bytes
            # A truncated file can still hold its whole header: its tensors' data must lie inside it.
            if end > size:
                raise GgufImportError(f"{self.path}: truncated: tensor {name} ends at byte {end} "
                                      f"but the file has {size}")
            # Each tensor's data follows the one before (as every GGUF writer lays them out): a
            # table whose tensors share or reorder data would make the import build many
            # times the file (3000 tensors on one block).
            if offset < prev_end:
                raise self.fail(f"tensor {name}'s data (at offset {offset}) overlaps or comes "
                                f"before the data of {prev_name}, which ends at offset {prev_end}")
            prev_name, prev_end = name, offset + n_bytes
            out[name] = GgufTensor(tuple(dims), ggml_type, n_bytes)
        return out


def _check_tokenizer(info: GgufInfo) -> None:
    """The vocabulary, and the special-token ids in it: transformers indexes it with them unchecked."""
    path, meta = info.path, info.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GgufImportError(f"{path}: metadata tokenizer.ggml.tokens is missing or not a list of strings")
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        v = meta.get(f"tokenizer.ggml.{key}")
        if v is not None and (type(v) is not int or not 0 <= v < len(tokens)):
            raise GgufImportError(f"{path}: metadata tokenizer.ggml.{key}={v!r} is not a token id "
                                  f"(the vocabulary has {len(tokens)} tokens)")


def _check_llama(info: GgufInfo) -> None:
    """:func:`check_header` for a llama file."""
    check_header(info, gguf_families.LLAMA)


def head_size(info: GgufInfo, fam: gguf_families.Family) -> int:
    """The attention head size the family's HF class will use (metadata checked by check_header)."""
    meta, arch = info.metadata, fam.arch
    heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    return meta.get(f"{arch}.{fam.head_key}", hidden // heads) if fam.head_key else hidden // heads


def check_header(info: GgufInfo, fam: gguf_families.Family) -> None:
    """The hyperparameters transformers builds the model from agree with the tensors it then
    loads: a corrupt count (a layer count of 2**32) would have it allocate without end, and a
    missing or renamed tensor would leave a layer at its random initial values. Each tensor's
    shape follows from the hyperparameters (the family's table); a tensor the family does not
    know is refused rather than dropped."""
    path, meta, tensors, arch = info.path, info.metadata, info.tensors, fam.arch

    def count(key: str, default: int | None = None) -> int:
        v = meta.get(f"{arch}.{key}", default)
        if type(v) is not int or v < 1:
            raise GgufImportError(f"{path}: metadata {arch}.{key}={v!r}; expected a positive integer")
        return v

    layers, hidden, ffn = count("block_count"), count("embedding_length"), count("feed_forward_length")
    heads = count("attention.head_count")
    kv_heads = count("attention.head_count_kv", heads)
    count("context_length")
    if hidden % heads or heads % kv_heads:
        raise GgufImportError(f"{path}: metadata {arch}.embedding_length={hidden}, attention.head_count="
                              f"{heads}, attention.head_count_kv={kv_heads}: the heads must divide the "
                              "width, and the KV heads the heads")
    head_dim = count(fam.head_key, hidden // heads) if fam.head_key else hidden // heads
    found = {int(m[1]) for name in tensors if (m := re.match(r"blk\.(\d+)\.", name))}
    if len(found) != layers or max(found, default=-1) != layers - 1:  # blocks 0 .. layers-1
        raise GgufImportError(f"{path}: metadata {arch}.block_count={layers}, but the file has tensors "
                              f"for layers {sorted(found)[:8]}{' ...' if len(found) > 8 else ''}")
    embd = tensors.get("token_embd.weight")
    vocab = embd.dims[-1] if embd else 0
    sizes = {"hidden": hidden, "ffn": ffn, "q": heads * head_dim, "kv": kv_heads * head_dim,
             "head": head_dim, "vocab": vocab, "qkv": (heads + 2 * kv_heads) * head_dim, "ffn2": 2 * ffn}
    want = {g: tuple(sizes[d] for d in dims) for g, (_, dims) in gguf_families.GLOBAL.items()
            if g != "output.weight" or (g in tensors and not fam.tied_only)}
    for i in range(layers):
        want.update({f"blk.{i}.{t}": tuple(sizes[d] for d in dims) for t, (_, dims) in fam.layer.items()})
    for name, shape in want.items():
        if name not in tensors:
            raise GgufImportError(f"{path}: missing tensor {name}")
        if tensors[name].dims != shape:
            raise GgufImportError(
                f"{path}: tensor {name} has shape {list(tensors[name].dims)}, but the metadata makes "
                f"it {list(shape)} ({arch}.embedding_length={hidden}, feed_forward_length={ffn}, "
                f"attention.head_count={heads}, attention.head_count_kv={kv_heads}, head size {head_dim})")
    if meta.get(f"{arch}.vocab_size", vocab) != vocab:
        raise GgufImportError(f"{path}: metadata {arch}.vocab_size={meta[f'{arch}.vocab_size']!r}, but "
                              f"token_embd.weight has {vocab} rows")
    if fam is not gguf_families.LLAMA:  # llama files keep what they did (rope_freqs is ignored)
        extra = sorted(set(tensors) - set(want))
        refused = next((t for t in extra if t in fam.refused), None)
        if refused:
            raise GgufImportError(f"{path}: tensor {refused}: {fam.refused[refused]}")
        if extra:
            raise GgufImportError(f"{path}: tensor {extra[0]} has no place in a {fam.title} "
                                  f"checkpoint ({len(extra)} such tensors)")
        scaling = meta.get(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":
            raise GgufImportError(f"{path}: metadata {arch}.rope.scaling.type={scaling!r}: rope "
                                  "scaling is not supported for this architecture yet")
        rot = meta.get(f"{arch}.rope.dimension_count", head_dim)
        if type(rot) is not int or not 0 < rot <= head_dim or rot % 2 or (rot != head_dim and not fam.partial_rope):
            raise GgufImportError(f"{path}: metadata {arch}.rope.dimension_count={rot!r}, but the head "
                                  f"size is {head_dim}" + ("" if fam.partial_rope else
                                                           f": a {fam.title} rotates the whole head"))
        if fam is gguf_families.GEMMA2:
            _check_gemma2(info, layers)


def _check_gemma2(info: GgufInfo, layers: int) -> None:
    """The Gemma 2 metadata read_config maps, checked (llama.cpp's defaults where it has one)."""
    path, meta = info.path, info.metadata
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        v = meta.get(f"gemma2.{key}", 1.0)
        if type(v) not in (int, float) or not 0 < v < math.inf:
            raise GgufImportError(f"{path}: metadata gemma2.{key}={v!r}; expected a positive number")
    window = meta.get("gemma2.attention.sliding_window", 1)
    if type(window) is not int or window < 1:
        raise GgufImportError(f"{path}: metadata gemma2.attention.sliding_window={window!r}; expected "
                              "a positive integer")
    base, local = meta.get("gemma2.rope.freq_base"), meta.get("gemma2.rope.freq_base_swa")
    if local is not None and local != base:
        raise GgufImportError(f"{path}: metadata gemma2.rope.freq_base_swa={local!r} differs from "
                              f"gemma2.rope.freq_base={base!r}: Gemma2ForCausalLM has one rope base")
    gemma2_layer_types(info, layers)


def gemma2_layer_types(info: GgufInfo, layers: int) -> list[str]:
    """Which layers attend through the sliding window, as llama.cpp reads them: every other one
    from the first (a period of 2), or attention.sliding_window_pattern when the file has it (a
    period n: layer i is local when i % n < n - 1, all local for 0; or one flag a layer)."""
    path, meta = info.path, info.metadata
    pattern = meta.get("gemma2.attention.sliding_window_pattern", 2)
    if isinstance(pattern, list):
        if len(pattern) != layers or any(type(p) is not bool for p in pattern):
            raise GgufImportError(f"{path}: metadata gemma2.attention.sliding_window_pattern has "
                                  f"{len(pattern)} values; expected one flag for each of {layers} layers")
        local = list(pattern)
    elif type(pattern) is int and pattern >= 0:
        local = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    else:
        raise GgufImportError(f"{path}: metadata gemma2.attention.sliding_window_pattern={pattern!r}; "
                              "expected a period or a flag for each layer")
    return ["sliding_attention" if f else "full_attention" for f in local]


def check_architecture(info: GgufInfo, error: type[GgufImportError] | None = None) -> gguf_families.Family:
    """The family of the file, or an error naming the architecture and the ones we take."""
    fam = gguf_families.family(info.architecture)
    if fam is None:
        raise (error or GgufImportError)(
            f"{info.path}: unsupported architecture {info.architecture!r} "
            f"(supported: {gguf_families.supported()}). Other architectures are not verified "
            "against llama.cpp. " + ARCH_FINDINGS.get(info.architecture, "")
        )
    return fam


def import_gguf(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, progress: bool = True) -> Path:
    """Convert ``src`` (GGUF) into a bf16 safetensors model directory ``out``."""
    src, out = Path(src).resolve(), Path(out).expanduser().resolve()
    info = inspect_gguf(src)
    fam = check_architecture(info)
    _check_tokenizer(info)
    check_header(info, fam)
    atomic.check_destination(out, kind=KIND, inputs=[src], force=force)
    source_sha = sha256_file(src)
    return atomic.build_once(out, {"source_sha256": source_sha, "converter": CONVERTER_VERSION},
                             lambda: _convert(src, out, info, source_sha, force=force, progress=progress),
                             force=force, log=logger, redo="converting again",
                             ready=f"{out} is already converted from {src.name}")


def _convert(src: Path, out: Path, info: GgufInfo, source_sha: str, *, force: bool,
             progress: bool) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    steps = ["tokenizer", "weights (dequantize)", "save"]
    bar = _progress(len(steps), f"import {src.name}", progress)
    with atomic.directory(out, kind=KIND, inputs=[src], force=force) as tmp:
        bar.set_postfix_str(steps[0])
        tok = read_tokenizer(src, info)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        fam = gguf_families.FAMILIES[info.architecture]
        # llama files load as they always did; the others with the config read_config fixes
        extra = {} if fam is gguf_families.LLAMA else {"config": read_config(src, info)}
        with _read_by_transformers(src, "weights"):
            model = AutoModelForCausalLM.from_pretrained(
                str(src.parent), gguf_file=src.name, dtype=torch.bfloat16, **extra
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
        check_chat_template(src, info, tok, GgufImportError)
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


def read_config(src: Path, info: GgufInfo) -> Any:
    """transformers' config from the GGUF metadata, with what its reading misses for the family:
    the head size (Qwen3's config class defaults to 128 when the metadata is not mapped) and the
    HF class."""
    from transformers import AutoConfig

    with _read_by_transformers(src, "config"):
        config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    fam = gguf_families.FAMILIES[info.architecture]
    if fam is not gguf_families.LLAMA:
        if fam.head_key:
            config.head_dim = head_size(info, fam)
        config.architectures = [fam.hf_class]
    if fam is gguf_families.GEMMA3:
        # the attention scale llama.cpp uses: 1/sqrt(head size), but 1/sqrt(hidden / heads) for
        # the 62-layer 27B; transformers' config would keep its default of 256
        meta = info.metadata
        config.query_pre_attn_scalar = (meta["gemma3.embedding_length"] // meta["gemma3.attention.head_count"]
                                        if meta["gemma3.block_count"] == 62 else config.head_dim)
    if fam is gguf_families.GEMMA2:
        _gemma2_config(config, info)
    if fam is gguf_families.PHI3:
        _phi3_config(config, info)
    return config


def _gemma2_config(config: Any, info: GgufInfo) -> None:
    """What transformers' reading of a Gemma 2 file leaves at Gemma2Config's defaults, as
    llama.cpp runs the file: both soft-caps (llama.cpp's defaults, the config's too, when the
    file has none), the window (4096 when absent) and which layers use it, and the attention
    scale: 1/sqrt(head size), but 1/sqrt(hidden / heads) for the 46-layer 27B."""
    meta = info.metadata
    layers = meta["gemma2.block_count"]
    config.attn_logit_softcapping = float(meta.get("gemma2.attn_logit_softcapping", 50.0))
    config.final_logit_softcapping = float(meta.get("gemma2.final_logit_softcapping", 30.0))
    config.sliding_window = meta.get("gemma2.attention.sliding_window", 4096)
    config.layer_types = gemma2_layer_types(info, layers)
    config.query_pre_attn_scalar = (meta["gemma2.embedding_length"] // meta["gemma2.attention.head_count"]
                                    if layers == 46 else config.head_dim)
    config.tie_word_embeddings = True


def _phi3_config(config: Any, info: GgufInfo) -> None:
    """Phi3Config's defaults that do not fit a GGUF: the head is tied when the file has no
    output.weight; the padding id is the file's (the default, 32000, is not a token of every
    vocabulary, and transformers' embedding refuses it then); no sliding window, because
    llama.cpp turns Phi-3's off whatever the file says; a rope over part of the head when
    rope.dimension_count says so."""
    meta = info.metadata
    config.tie_word_embeddings = "output.weight" not in info.tensors
    config.pad_token_id = meta.get("tokenizer.ggml.padding_token_id")
    config.sliding_window = None
    head = meta["phi3.embedding_length"] // meta["phi3.attention.head_count"]
    rot = meta.get("phi3.rope.dimension_count", head)
    params = dict(getattr(config, "rope_parameters", None) or {})
    params["partial_rotary_factor"] = rot / head
    config.rope_parameters = params


def read_tokenizer(src: Path, info: GgufInfo) -> Any:
    """transformers' tokenizer from the GGUF metadata, splitting text as the file's
    ``tokenizer.ggml.pre`` says (:mod:`gguf_pretokenizer`). For the families after Llama, it adds
    <bos> when the file says so (tokenizer.ggml.add_bos_token): transformers' builder ignores
    the key, and Gemma without its <bos> degenerates. The setting is saved with the tokenizer,
    so vLLM prepends it too."""
    from transformers import AutoTokenizer

    from vllm_edge.models import gguf_pretokenizer

    with _read_by_transformers(src, "tokenizer"):
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tok = gguf_pretokenizer.honour(tok, info.metadata, src)
    add_bos = info.metadata.get("tokenizer.ggml.add_bos_token")
    if info.architecture != "llama" and isinstance(add_bos, bool):
        if add_bos and tok.bos_token is None:
            raise GgufImportError(f"{src}: tokenizer.ggml.add_bos_token is true but the file names "
                                  "no BOS token (tokenizer.ggml.bos_token_id)")
        tok.add_bos_token = add_bos
    return tok


def check_chat_template(src: Path, info: GgufInfo, tok: Any, error: type[GgufImportError]) -> None:
    """Llama files must carry a chat template; the other families may be base models without
    one (they then serve completions, not chat), which is logged."""
    if getattr(tok, "chat_template", None) is not None:
        return
    if info.architecture == "llama":
        raise error(f"{src}: the GGUF carries no chat template (tokenizer.chat_template)")
    logger.warning("%s: no chat template (tokenizer.chat_template): a base model; it serves "
                   "completions, and chat needs a template of your own", src)


@contextlib.contextmanager
def _read_by_transformers(src: Path, what: str) -> Iterator[None]:
    """What transformers raises on a file inspect_gguf passed (its own GGUF reader and
    tokenizer builder raise KeyError, IndexError, ValueError, ... on odd metadata), as an
    error naming the file."""
    try:
        yield
    except ImportError:
        raise  # a missing package, not a bad file
    except Exception as exc:
        raise GgufImportError(f"{src}: transformers cannot read its {what} "
                              f"({type(exc).__name__}: {exc})") from None


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="step")
