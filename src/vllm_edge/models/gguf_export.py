"""bf16 safetensors Llama directory -> GGUF (BF16 or F16), then llama.cpp quantizations.

Written with the ``gguf`` library: metadata, the byte-level BPE tokenizer
(vocab, merges, token types, special ids, chat template) and the tensors.
Tensor data is streamed one tensor at a time, so peak memory is one tensor,
not the model. Quantized builds (Q4_K_M, Q4_0, Q8_0, ...) come from llama.cpp's
own ``llama_model_quantize``, so they are exactly what llama.cpp users get.

Every output appears only when complete (temp path, then rename).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from vllm_edge.common import atomic, model_config
from vllm_edge.common.errors import EdgeError

logger = logging.getLogger("vllm_edge.models")

EXPORTER_VERSION = "gguf-export/1"
DEFAULT_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")


class GgufExportError(EdgeError):
    """A model directory that cannot be exported; the message says why."""


@dataclass(frozen=True)
class LlamaShape:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    rms_eps: float
    rope_theta: float
    vocab_size: int
    tied: bool


# --- config ------------------------------------------------------------------

def _rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rtype = rp.get("rope_type", rp.get("type", "default"))
    if rtype not in ("default", None):
        # llama3/yarn scaling needs rope_freqs or extra metadata we do not write yet.
        raise GgufExportError(f"rope scaling {rtype!r} is not supported by the exporter")
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise GgufExportError("config.json has no rope_theta")
    return float(theta)


def read_llama_config(src: Path) -> LlamaShape:
    p = src / "config.json"
    if not p.exists():
        raise GgufExportError(f"{src}: no config.json")
    cfg = json.loads(p.read_text())
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" or archs != ["LlamaForCausalLM"]:
        raise GgufExportError(
            f"{src}: model_type {cfg.get('model_type')!r} / architectures {archs}: only "
            "LlamaForCausalLM is supported (gemma3 and others are not verified against llama.cpp)")
    if cfg.get("quantization_config"):
        raise GgufExportError(f"{src}: the checkpoint is quantized; export needs bf16/f16/f32 weights")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise GgufExportError(f"{src}: attention or MLP biases are not supported by the exporter")
    n_head = int(cfg["num_attention_heads"])
    return LlamaShape(
        n_layer=int(cfg["num_hidden_layers"]), n_embd=int(cfg["hidden_size"]),
        n_ff=int(cfg["intermediate_size"]), n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // n_head),
        n_ctx=int(cfg.get("max_position_embeddings") or 2048),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(cfg),
        vocab_size=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)))


# --- tensors -----------------------------------------------------------------

_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str | None:
    """The llama.cpp tensor name; None for tensors llama.cpp recomputes itself."""
    if hf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[hf_name]
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    parts = hf_name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
        rest = ".".join(parts[3:])
        if rest in _LAYER_MAP:
            return f"blk.{int(parts[2])}.{_LAYER_MAP[rest]}"
    raise GgufExportError(f"tensor {hf_name!r} has no llama.cpp name; refusing to drop it")


def rope_interleave(w, n_head: int):
    """HF Llama stores each head's q/k rows as [first halves | second halves] for
    rotate_half; llama.cpp's LLAMA rope rotates adjacent pairs (2i, 2i+1). Reorder
    rows so pair i holds (row i, row i + d/2) of the head."""
    rows = w.shape[0]
    d = rows // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _weight_files(src: Path) -> list[Path]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise GgufExportError(f"{src}: no *.safetensors files")
    return files


def _tensor_index(src: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index: dict[str, Path] = {}
    for f in _weight_files(src):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                index[k] = f
    return index


def planned_tensors(src: Path, shape: LlamaShape) -> list[tuple[str, str]]:
    """(hf_name, gguf_name) in llama.cpp's usual order: embeddings, blocks, head."""
    index = _tensor_index(src)
    plan = [(k, gguf_name(k)) for k in index]
    plan = [(k, g) for k, g in plan if g is not None]
    if shape.tied and any(g == "output.weight" for _, g in plan):
        plan = [(k, g) for k, g in plan if g != "output.weight"]  # llama.cpp reuses token_embd

    def order(item: tuple[str, str]) -> tuple[int, int, str]:
        g = item[1]
        if g.startswith("blk."):
            return (1, int(g.split(".")[1]), g)
        return (0 if g == "token_embd.weight" else 2, 0, g)

    plan.sort(key=order)
    names = {g for _, g in plan}
    need = {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{v}" for i in range(shape.n_layer) for v in _LAYER_MAP.values()}
    if not shape.tied:
        need.add("output.weight")
    missing = sorted(need - names)
    if missing:
        raise GgufExportError(f"{src}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return plan


def _converted(src: Path, hf: str, g: str, shape: LlamaShape, index: dict[str, Path], out_type: str):
    """One tensor as the numpy array to write, and its GGML type."""
    import torch
    from gguf import GGMLQuantizationType as Q
    from safetensors import safe_open

    with safe_open(str(index[hf]), "pt") as fh:
        t = fh.get_tensor(hf)
    if g.endswith("attn_q.weight"):
        t = rope_interleave(t, shape.n_head)
    elif g.endswith("attn_k.weight"):
        t = rope_interleave(t, shape.n_head_kv)
    if t.dim() == 1:  # norms: llama.cpp keeps them in F32
        return t.float().contiguous().numpy(), Q.F32
    if out_type == "bf16":
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16), Q.BF16
    h = t.to(torch.float16)
    if not torch.isfinite(h).all():
        raise GgufExportError(f"{hf}: values overflow float16; export with --type bf16")
    return h.contiguous().numpy(), Q.F16


# --- tokenizer ---------------------------------------------------------------

def _pre_tokenizer_name(pre: dict | None) -> str:
    """llama.cpp's name for the pre-tokenizer, recognised from tokenizer.json's structure."""
    def is_bytelevel(p: dict) -> bool:
        return p.get("type") == "ByteLevel" and p.get("use_regex", True)

    if pre and is_bytelevel(pre):
        return "gpt-2"  # llama.cpp's name for GPT-2's regex ("gpt2" is the tokenizer model)
    if pre and pre.get("type") == "Sequence":
        seq = pre.get("pretokenizers", [])
        if (len(seq) == 2 and seq[0].get("type") == "Digits" and seq[0].get("individual_digits")
                and is_bytelevel(seq[1])):
            return "smollm"  # one digit per token, then GPT-2's regex
    raise GgufExportError(
        f"unrecognised pre-tokenizer {json.dumps(pre)[:200]}; pass --tokenizer-pre NAME "
        "(a llama.cpp tokenizer.ggml.pre value) if you know which one it is")


@dataclass
class TokenizerData:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    special: dict[str, int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def read_tokenizer(src: Path, vocab_size: int, pre: str | None = None) -> TokenizerData:
    from gguf import TokenType
    from tokenizers import Tokenizer

    tj_path = src / "tokenizer.json"
    if not tj_path.exists():
        raise GgufExportError(f"{src}: no tokenizer.json (only byte-level BPE tokenizers are supported)")
    tj = json.loads(tj_path.read_text())
    model = tj.get("model", {})
    if model.get("type") != "BPE" or not isinstance(tj.get("decoder"), dict) or \
            tj["decoder"].get("type") != "ByteLevel":
        raise GgufExportError(f"{src}: tokenizer is not byte-level BPE; not supported by the exporter")
    id_to_tok: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    for i, a in added.items():
        id_to_tok[i] = a["content"]
    n = max(vocab_size, max(id_to_tok) + 1)
    if n != vocab_size:
        raise GgufExportError(f"{src}: tokenizer has ids up to {n - 1} but vocab_size is {vocab_size}")
    tokens, types = [], []
    for i in range(n):
        if i not in id_to_tok:  # padding rows of the embedding
            tokens.append(f"[PAD{i}]")
            types.append(int(TokenType.UNUSED))
        elif i in added:
            tokens.append(id_to_tok[i])
            types.append(int(TokenType.CONTROL if added[i].get("special") else TokenType.USER_DEFINED))
        else:
            tokens.append(id_to_tok[i])
            types.append(int(TokenType.NORMAL))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    tc_path = src / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.exists() else {}
    cfg = model_config.read(src / "config.json")
    tok_to_id = {t: i for i, t in id_to_tok.items()}

    def special_id(name: str) -> int | None:
        v = tc.get(f"{name}_token")
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str) and v in tok_to_id:
            return tok_to_id[v]
        cid = cfg.get(f"{name}_token_id")
        return cid[0] if isinstance(cid, list) else cid

    special = {k: i for k in ("bos", "eos", "unk", "pad") if (i := special_id(k)) is not None}
    # Whether BOS/EOS are added is decided by the post-processor: ask the tokenizer.
    enc = Tokenizer.from_file(str(tj_path)).encode("a", add_special_tokens=True).ids
    add_bos = bool(enc) and enc[0] == special.get("bos")
    add_eos = bool(enc) and enc[-1] == special.get("eos")

    template = None
    if (src / "chat_template.jinja").exists():
        template = (src / "chat_template.jinja").read_text()
    elif isinstance(tc.get("chat_template"), str):
        template = tc["chat_template"]
    return TokenizerData(tokens=tokens, token_types=types, merges=merges,
                         pre=pre or _pre_tokenizer_name(tj.get("pre_tokenizer")), special=special,
                         add_bos=add_bos, add_eos=add_eos, chat_template=template)


# --- writer ------------------------------------------------------------------

def _model_name(src: Path) -> str:
    cfg = model_config.read(src / "config.json")
    return str(cfg.get("_model_name_or_path") or src.name)


def _write_metadata(w, src: Path, shape: LlamaShape, tok: TokenizerData, out_type: str) -> None:
    import gguf

    w.add_name(_model_name(src))
    w.add_type("model")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16 if out_type == "bf16" else gguf.LlamaFileType.MOSTLY_F16))
    w.add_string("general.converted_by", EXPORTER_VERSION)
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    if shape.head_dim * shape.n_head != shape.n_embd:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.vocab_size)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.token_types)
    w.add_token_merges(tok.merges)
    setters = {"bos": w.add_bos_token_id, "eos": w.add_eos_token_id,
               "unk": w.add_unk_token_id, "pad": w.add_pad_token_id}
    for k, i in tok.special.items():
        setters[k](int(i))
    w.add_add_bos_token(tok.add_bos)
    w.add_add_eos_token(tok.add_eos)
    w.add_add_space_prefix(False)
    if tok.chat_template:
        w.add_chat_template(tok.chat_template)


def written_by_us(path: Path) -> bool:
    """Whether ``path`` is a GGUF this exporter wrote (or llama.cpp quantized from one: its
    quantizer keeps the metadata)."""
    try:
        import gguf

        field = gguf.GGUFReader(str(path)).get_field("general.converted_by")
        value = field.contents() if field is not None else None
    except Exception:  # not a GGUF, or not one we can read: not ours
        return False
    return isinstance(value, str) and value.split("/")[0] == EXPORTER_VERSION.split("/")[0]


def export_gguf(src: str | os.PathLike, out: str | os.PathLike, *, out_type: str = "bf16",
                tokenizer_pre: str | None = None, progress: bool = True, force: bool = False) -> Path:
    """Write ``out`` (GGUF, BF16 or F16 weights, F32 norms) from a Llama safetensors dir.
    An existing ``out`` this exporter did not write is refused unless ``force``."""
    import gguf

    if out_type not in ("bf16", "f16"):
        raise GgufExportError(f"--type {out_type!r}: expected bf16 or f16")
    src, out = Path(src).expanduser().resolve(), Path(out).expanduser().resolve()
    if not src.is_dir():
        raise GgufExportError(f"{src}: not a model directory")
    atomic.check_destination(out, inputs=[src], force=force, is_ours=written_by_us)
    shape = read_llama_config(src)
    tok = read_tokenizer(src, shape.vocab_size, tokenizer_pre)
    plan = planned_tensors(src, shape)
    index = _tensor_index(src)
    from safetensors import safe_open

    infos = []
    for hf, g in plan:
        with safe_open(str(index[hf]), "pt") as fh:
            dims = tuple(fh.get_slice(hf).get_shape())
        if len(dims) == 1:
            infos.append((g, dims, np.dtype(np.float32), 4 * dims[0], gguf.GGMLQuantizationType.F32))
        else:
            qt = gguf.GGMLQuantizationType.BF16 if out_type == "bf16" else gguf.GGMLQuantizationType.F16
            dt = np.dtype(np.uint16) if out_type == "bf16" else np.dtype(np.float16)
            infos.append((g, dims, dt, 2 * int(np.prod(dims)), qt))

    bar = _progress(sum(i[3] for i in infos), f"export {out.name}", progress)
    with atomic.file_path(out, inputs=[src], force=force, is_ours=written_by_us) as tmp:
        w = gguf.GGUFWriter(str(tmp), "llama")
        _write_metadata(w, src, shape, tok, out_type)
        for g, dims, dt, nbytes, qt in infos:
            w.add_tensor_info(g, dims, dt, nbytes, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for (hf, g), (_, dims, _, nbytes, qt) in zip(plan, infos):
            arr, got_qt = _converted(src, hf, g, shape, index, out_type)
            assert got_qt == qt and tuple(arr.shape) == dims, (hf, got_qt, qt, arr.shape, dims)
            w.write_tensor_data(arr)
            bar.update(nbytes)
        w.close()
    bar.close()
    return out


# --- llama.cpp quantization ----------------------------------------------------

def quantized_path(out: Path, qtype: str) -> Path:
    """model.gguf -> model.Q4_K_M.gguf"""
    return out.with_name(f"{out.stem}.{qtype}{out.suffix or '.gguf'}")


def parse_quants(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(q.strip().upper() for q in text.split(",") if q.strip())


def llama_ftype(qtype: str) -> int:
    import llama_cpp

    val = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}", None)
    if val is None:
        known = sorted(n[len("LLAMA_FTYPE_MOSTLY_"):] for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_MOSTLY_"))
        raise GgufExportError(f"unknown llama.cpp quantization {qtype!r}; known: {', '.join(known)}")
    return int(val)


def quantize(src_gguf: str | os.PathLike, out: str | os.PathLike, qtype: str, *,
             threads: int | None = None, force: bool = False) -> Path:
    """Quantize with llama.cpp's own llama_model_quantize (its default mixture for the type)."""
    import ctypes

    try:
        import llama_cpp
    except ImportError:
        raise GgufExportError("quantizing needs llama-cpp-python: pip install 'vllm-edge[baselines]'") from None
    out = Path(out).expanduser().resolve()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_ftype(qtype)
    params.nthread = threads or len(os.sched_getaffinity(0))
    with atomic.file_path(out, inputs=[src_gguf], force=force, is_ours=written_by_us) as tmp:
        rc = llama_cpp.llama_model_quantize(str(Path(src_gguf)).encode(), str(tmp).encode(),
                                            ctypes.byref(params))
        if rc != 0:
            raise GgufExportError(f"llama_model_quantize({qtype}) failed with code {rc}")
    return out


def export_all(src: str | os.PathLike, out: str | os.PathLike, *, out_type: str = "bf16",
               quants: tuple[str, ...] = (), tokenizer_pre: str | None = None,
               threads: int | None = None, progress: bool = True, force: bool = False) -> list[Path]:
    for q in quants:  # fail on a bad name or a destination we may not replace before the long export
        llama_ftype(q)
        atomic.check_destination(quantized_path(Path(out).expanduser().resolve(), q), inputs=[src],
                                 force=force, is_ours=written_by_us)
    base = export_gguf(src, out, out_type=out_type, tokenizer_pre=tokenizer_pre, progress=progress,
                       force=force)
    paths = [base]
    bar = _progress(len(quants), "llama.cpp quantize", progress and bool(quants), unit="type")
    for q in quants:
        bar.set_postfix_str(q)
        paths.append(quantize(base, quantized_path(base, q), q, threads=threads, force=force))
        bar.update(1)
    bar.close()
    return paths


def _progress(total: int, desc: str, enabled: bool, unit: str = "B"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit=unit,
                unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000)


def iter_metadata(path: str | os.PathLike) -> Iterator[tuple[str, object]]:
    """(key, value) pairs of a GGUF's metadata, arrays as lists; for tests and debugging."""
    import gguf

    r = gguf.GGUFReader(str(path))
    for k, f in r.fields.items():
        if not k.startswith("GGUF."):
            yield k, f.contents()
