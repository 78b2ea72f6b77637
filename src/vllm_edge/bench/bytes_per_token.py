"""Bytes a batch-1 decode step reads from memory, counted from the checkpoint on disk.

Read from the safetensors headers (no engine, no weights loaded), at the layout the
engine really runs:

* a float tensor is read at the engine's dtype (``--dtype``), whatever it is stored in;
* a ``cpu_int4`` linear reads its tinygemm tensors: the packed nibbles (K/2 bytes per
  row) and the bf16 (scale, zero) pairs at the *kernel* group size, which is smaller than
  the checkpoint's when K is not a multiple of it (:func:`vllm_edge.quant.pack.kernel_group`
  duplicates scales then); a shape tinygemm refuses runs from the checkpoint layout;
* a ``cpu_int8`` linear of a GGUF repack is counted at the bits its repack report says decode
  reads where this CPU runs the packed product (:mod:`vllm_edge.quant.lowbit`), else as
  stored;
* other quantized formats (GPTQ) are counted as stored: their runtime repacking is
  vLLM's, and we do not model it (the result says so);
* the output head is read in full every token, *including when it is tied to the
  embedding*: then it reads the embedding's tensors;
* the input embedding is a lookup: one row per token, not the table;
* the KV cache: every layer reads K and V for every position of the context, so
  ``layers x 2 x kv_heads x head_dim x KV dtype bytes`` per context token.

Not counted: activations, the rotary table, sampling, and the norm weights' re-reads by
other threads (all small next to the weights, and mostly cache-resident).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant.formats.cpu_int4 import NAME as CPU_INT4

# safetensors dtype strings -> bytes per element
ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                  "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2,
                  "U32": 4, "U64": 8}
FLOAT_ST = {"F64", "F32", "F16", "BF16"}
ENGINE_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
                      "float32": 4, "float": 4, "fp32": 4, "auto": 2,
                      "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
CPU_INT4_PARTS = ("weight_packed", "weight_scale", "weight_zero")
GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
INT8_PARTS = ("weight_int8", "weight_scale", "weight_zero")


class AccountingError(EdgeError, ValueError):
    """The checkpoint cannot be accounted (missing file, unknown dtype, bad config)."""


@dataclass(frozen=True)
class TensorSpec:
    dtype: str          # safetensors dtype string, e.g. "BF16", "U8"
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ST_DTYPE_BYTES[self.dtype]


@dataclass
class Accounting:
    model: str
    dtype: str                      # the engine dtype floats are read at
    quant_method: str | None
    group_size: int | None
    linear_bytes: int = 0           # every layer's projections, read once per token
    linear_params: int = 0
    head_bytes: int = 0
    head_params: int = 0
    head_tied: bool = False         # the head reads the embedding's tensors
    embedding_row_bytes: int = 0    # the lookup reads one row per token
    embedding_table_bytes: int = 0  # what is resident, for contrast; not read per token
    other_bytes: int = 0            # norms, biases: read every token
    kv_bytes_per_context_token: int = 0
    kv_dtype: str = "bfloat16"
    layout: str = "bf16"            # "bf16", "cpu_int4 tinygemm", or "as stored (...)"
    notes: list[str] = field(default_factory=list)

    @property
    def weight_bytes_per_token(self) -> int:
        return self.linear_bytes + self.head_bytes + self.embedding_row_bytes + self.other_bytes

    def kv_bytes(self, context_tokens: float) -> int:
        return int(round(self.kv_bytes_per_context_token * context_tokens))

    def per_token(self, context_tokens: float) -> int:
        """Total bytes one decoded token reads with ``context_tokens`` positions in the KV cache."""
        return self.weight_bytes_per_token + self.kv_bytes(context_tokens)

    def bits_per_weight(self) -> dict[str, float | None]:
        def bpw(b: int, n: int) -> float | None:
            return round(8 * b / n, 4) if n else None

        return {"linears": bpw(self.linear_bytes, self.linear_params),
                "head": bpw(self.head_bytes, self.head_params),
                "linears_and_head": bpw(self.linear_bytes + self.head_bytes,
                                        self.linear_params + self.head_params)}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["weight_bytes_per_token"] = self.weight_bytes_per_token
        d["bits_per_weight"] = self.bits_per_weight()
        return d


# --- reading ----------------------------------------------------------------------

def read_specs(model_dir: str | os.PathLike) -> dict[str, TensorSpec]:
    """Name -> dtype and shape of every tensor, from the safetensors headers only."""
    from safetensors import safe_open

    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise AccountingError(f"{d}: no *.safetensors files to account")
    specs: dict[str, TensorSpec] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                sl = h.get_slice(name)
                dt = sl.get_dtype()
                if dt not in ST_DTYPE_BYTES:
                    raise AccountingError(f"{f}: tensor {name} has dtype {dt}, which the "
                                          f"accounting does not know")
                specs[name] = TensorSpec(dt, tuple(int(x) for x in sl.get_shape()))
    return specs


def _text_config(config: Mapping) -> Mapping:
    return config.get("text_config", config)


def _need(cfg: Mapping, key: str, where: str) -> int:
    v = cfg.get(key)
    if v is None:
        raise AccountingError(f"{where}: config.json lacks {key!r}")
    return int(v)


def kv_bytes_per_context_token(config: Mapping, kv_dtype: str = "bfloat16",
                               where: str = "config.json") -> int:
    """layers x 2 (K and V) x kv_heads x head_dim x dtype bytes."""
    tc = _text_config(config)
    layers = _need(tc, "num_hidden_layers", where)
    heads = _need(tc, "num_attention_heads", where)
    kv_heads = int(tc.get("num_key_value_heads") or heads)
    head_dim = int(tc.get("head_dim") or _need(tc, "hidden_size", where) // heads)
    if kv_dtype not in ENGINE_DTYPE_BYTES:
        raise AccountingError(f"unknown KV cache dtype {kv_dtype!r}; known: {sorted(ENGINE_DTYPE_BYTES)}")
    return layers * 2 * kv_heads * head_dim * ENGINE_DTYPE_BYTES[kv_dtype]


# --- the accounting ---------------------------------------------------------------

def _module_of(name: str) -> tuple[str, str]:
    base, _, leaf = name.rpartition(".")
    return base, leaf


def _cpu_int4_runtime_bytes(parts: Mapping[str, TensorSpec], group: int, where: str) -> tuple[int, int]:
    """(bytes read per use, weights) of one cpu_int4 module at its runtime layout."""
    from vllm_edge.quant import pack

    missing = [p for p in CPU_INT4_PARTS if p not in parts]
    if missing:
        raise AccountingError(f"cpu_int4 module {where} lacks {', '.join(where + '.' + m for m in missing)}")
    n, half_k = parts["weight_packed"].shape
    k = 2 * half_k
    stored = sum(parts[p].nbytes for p in CPU_INT4_PARTS)
    ok, _ = pack.supports(n, k, group)
    if not ok:  # fallback: dequantize from the checkpoint layout every call
        return stored, n * k
    kgroup = pack.kernel_group(k, group)
    return n * half_k + (k // kgroup) * n * 2 * 2, n * k


def _extra_bytes(parts: Mapping[str, TensorSpec], known: tuple[str, ...], fbytes: int) -> int:
    """Biases and anything else beside the quantized tensors."""
    return sum(s.numel * fbytes if s.dtype in FLOAT_ST else s.nbytes
               for leaf, s in parts.items() if leaf not in known)


def account(config: Mapping, specs: Mapping[str, TensorSpec], dtype: str = "bfloat16",
            kv_dtype: str | None = None, model: str = "",
            int8_bits: Mapping[str, float] | None = None) -> Accounting:
    """Bytes per decoded token of the checkpoint described by ``config`` and ``specs``.
    ``int8_bits``: module -> bits per weight decode reads for a ``cpu_int8`` module (codes,
    scales and offsets), where known; the others are counted as stored."""
    where = model or "checkpoint"
    if dtype not in ENGINE_DTYPE_BYTES:
        raise AccountingError(f"unknown engine dtype {dtype!r}; known: {sorted(ENGINE_DTYPE_BYTES)}")
    fbytes = ENGINE_DTYPE_BYTES[dtype]
    qcfg = config.get("quantization_config") or _text_config(config).get("quantization_config")
    method = str(qcfg.get("quant_method")).lower() if qcfg else None
    group = int(qcfg["group_size"]) if qcfg and qcfg.get("group_size") else None
    if method == CPU_INT4 and group is None:
        raise AccountingError(f"{where}: quantization_config (cpu_int4) has no group_size")
    tc = _text_config(config)
    tied = bool(tc.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    acc = Accounting(model=model, dtype=dtype, quant_method=method, group_size=group,
                     kv_dtype=kv_dtype or dtype,
                     layout=("cpu_int4 tinygemm" if method == CPU_INT4
                             else f"as stored ({method})" if method else dtype))
    acc.kv_bytes_per_context_token = kv_bytes_per_context_token(config, acc.kv_dtype, where)

    modules: dict[str, dict[str, TensorSpec]] = {}
    for name, spec in specs.items():
        base, leaf = _module_of(name)
        modules.setdefault(base, {})[leaf] = spec

    def module_bytes(base: str, parts: dict[str, TensorSpec]) -> tuple[int, int]:
        if method == CPU_INT4 and "weight_packed" in parts:
            b, n = _cpu_int4_runtime_bytes(parts, group, base)
            return b + _extra_bytes(parts, CPU_INT4_PARTS, fbytes), n
        if "weight_int8" in parts:
            n = parts["weight_int8"].numel
            if int8_bits and base in int8_bits:
                return int(round(int8_bits[base] * n / 8)) + _extra_bytes(parts, INT8_PARTS, fbytes), n
            return sum(s.nbytes for s in parts.values()), n
        if any(p in parts for p in GPTQ_PARTS) and "qweight" in parts:
            q = parts["qweight"]  # int32 [K/8, N] -> K*N weights
            return sum(s.nbytes for s in parts.values()), q.shape[0] * 8 * q.shape[1]
        total, weights = 0, 0
        for leaf, s in parts.items():
            total += s.numel * fbytes if s.dtype in FLOAT_ST else s.nbytes
            if leaf == "weight" and len(s.shape) == 2:
                weights += s.numel
        return total, weights

    embed = next((b for b in modules if b.endswith("embed_tokens")), None)
    head = next((b for b in modules if b == "lm_head" or b.endswith(".lm_head")), None)
    for base, parts in modules.items():
        b, n = module_bytes(base, parts)
        if base == embed:
            acc.embedding_table_bytes = b
            rows = _rows(parts)
            acc.embedding_row_bytes = -(-b // rows) if rows else 0
        elif base == head:
            acc.head_bytes, acc.head_params = b, n
        elif n:
            acc.linear_bytes += b
            acc.linear_params += n
        else:
            acc.other_bytes += b
    if head is None:
        if embed is None:
            raise AccountingError(f"{where}: no lm_head and no embed_tokens tensors: cannot find the head")
        if not tied:
            raise AccountingError(f"{where}: no lm_head tensors, and tie_word_embeddings is false")
        acc.head_tied = True
        acc.head_bytes, acc.head_params = module_bytes(embed, modules[embed])
        acc.notes.append("the head is tied to the embedding: it reads the embedding's tensors in "
                         "full every token, counted once as the head")
    if embed is not None:
        acc.notes.append(f"the embedding lookup reads one row ({acc.embedding_row_bytes} B) per "
                         f"token, not its {acc.embedding_table_bytes} B table")
    if method and method != CPU_INT4:
        acc.notes.append(f"{method} tensors are counted as stored; vLLM's runtime repacking of "
                         "them is not modelled")
    return acc


def _rows(parts: Mapping[str, TensorSpec]) -> int:
    for leaf in ("weight", "weight_packed"):
        if leaf in parts:
            return parts[leaf].shape[0]
    return 0


def account_dir(model_dir: str | os.PathLike, dtype: str = "bfloat16",
                kv_dtype: str | None = None) -> Accounting:
    d = Path(model_dir)
    cfg_path = d / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise AccountingError(f"{cfg_path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise AccountingError(f"{cfg_path}: not valid JSON ({exc})") from None
    int8_bits = _packed_bits(d)
    acc = account(config, read_specs(d), dtype=dtype, kv_dtype=kv_dtype, model=str(d),
                  int8_bits=int8_bits)
    if int8_bits:
        acc.notes.append("cpu_int8 modules at the bits decode reads with their codes "
                         "packed on this CPU (repack_report.json, runtime_bits_per_weight)")
    return acc


def _packed_bits(d: Path) -> dict[str, float] | None:
    """A GGUF repack's per-module runtime bits, where this CPU packs cpu_int8 codes at load."""
    from vllm_edge.models.gguf_repack import REPORT_NAME

    try:
        report = json.loads((d / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return None
    tensors = report.get("tensors") if isinstance(report, dict) else None
    if not tensors:
        return None
    from vllm_edge.quant import lowbit

    if not lowbit.supported():
        return None
    return {e["name"][: -len(".weight")]: float(e["runtime_bits_per_weight"]) for e in tensors
            if e.get("route") == "repack8" and "runtime_bits_per_weight" in e
            and str(e.get("name", "")).endswith(".weight")}


def mean_context(prompt_tokens: int, tg_tokens: int) -> float:
    """Mean KV positions read by the decode steps a tg measurement times.

    tg = (N - 1) / (t_N - t_1): the timed steps are tokens 2..N, which attend to
    prompt + 1 ... prompt + N - 1 positions; their mean is prompt + N / 2.
    """
    return prompt_tokens + tg_tokens / 2


def summary(acc: Accounting, contexts: Iterable[tuple[str, float]]) -> dict:
    """Per metric: the context, weight, KV and total bytes per token."""
    return {key: {"context_tokens": ctx, "weight_bytes": acc.weight_bytes_per_token,
                  "kv_bytes": acc.kv_bytes(ctx), "bytes_per_token": acc.per_token(ctx)}
            for key, ctx in contexts}
