"""Checkpoints made on the spot (a copy of a model directory without its weights, a tiny GGUF
file of any architecture, a tiny llama GGUF that converts, a tiny bf16 llama directory that
quantizes), and the check that a failed write left nothing behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

WEIGHTS = "model.safetensors"


def copy_without_weights(src: Path, dst: Path) -> Path:
    """``dst`` (created) with every file of ``src`` but its weights (config, tokenizer, ...)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != WEIGHTS:
            shutil.copy(f, dst / f.name)
    return dst


def no_partial_output(out: Path) -> bool:
    """Neither ``out`` nor a temporary ``.{out.name}.*`` sibling (the atomic writers' staging
    directory) exists: a failed conversion left nothing behind. The writer's lock file
    (``.{out.name}.lock``, empty) is allowed to stay, as lock files do."""
    return not out.exists() and not any(p.name.startswith(f".{out.name}.") and p.name != f".{out.name}.lock"
                                        for p in out.parent.iterdir())


def tiny_gguf(path: Path, arch: str) -> Path:
    """A GGUF file declaring ``arch`` with one 4x8 zero tensor (enough to be refused)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_llama_gguf(path: Path, *, hidden: int = 32, ffn: int = 64, types: dict[str, str] | None = None,
                    tied: bool = True, arch: str = "llama", head_dim: int | None = None,
                    add_bos: bool | None = None, chat_template: bool = True) -> Path:
    """A complete llama GGUF that ``models import-gguf`` converts in a fraction of a second:
    one layer ``hidden`` wide, a 32-token byte-level vocabulary with merges, special tokens and a
    chat template; f32 tensors and two Q8_0 ones (so a block type is dequantized too).

    ``types`` sets the type of any tensor by GGUF name ("Q4_0", "Q4_1", "Q8_0", ... made by
    gguf's quantizer; the K types, which gguf cannot make, as random blocks with finite fp16
    fields, every bit pattern of the sub-block scales and of the codes being valid). ``tied=False`` adds an
    ``output.weight``. ``arch`` "qwen2" adds f32 q/k/v biases, "qwen3" q/k norms and the head
    size ``head_dim`` (default hidden / heads) as attention.key_length; "gemma3" Gemma 3's four
    norms a block (stored as 1 + w, as llama.cpp's convert writes them), q/k norms and the key
    length; "gemma2" Gemma 2's four norms (1 + w), the key length, soft-caps of 20 (attention)
    and 15 (final) and a window of 16; "phi3" llama.cpp's fused attn_qkv (q, k, v rows) and
    ffn_up (gate rows, then up) in place of the separate ones. ``add_bos`` writes tokenizer.ggml.add_bos_token; ``chat_template=False`` leaves the
    template out."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    heads, kv_heads = 4, 2
    tokens = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
        "\u0120", "\u0120a", "ab", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chosen = {"blk.0.attn_q.weight": "Q8_0", "blk.0.ffn_gate.weight": "Q8_0", **(types or {})}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    head = head_dim or hidden // heads
    w.add_rope_dimension_count(head)
    if arch in ("qwen3", "gemma3", "gemma2"):
        w.add_key_length(head)
        w.add_value_length(head)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(20.0)
        w.add_final_logit_softcapping(15.0)
        w.add_sliding_window(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 3) + [3, 3, 3])  # the last three are control tokens
    w.add_token_merges(["\u0120 a", "a b"])
    w.add_bos_token_id(len(tokens) - 3)
    w.add_eos_token_id(len(tokens) - 1)
    if chat_template:
        w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                            "<|im_end|>\n{% endfor %}")
    if add_bos is not None:
        w.add_add_bos_token(add_bos)

    def tensor(name: str, shape: tuple[int, ...]) -> None:
        a = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        qname = chosen.get(name)
        if qname is None:
            w.add_tensor(name, a)
            return
        qtype = gguf.GGMLQuantizationType[qname]
        if qname in K_BLOCKS:
            q = random_k_blocks(rng, shape, qname)
        else:
            q = gguf.quants.quantize(a, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    kv, q = kv_heads * head, heads * head
    tensor("token_embd.weight", (len(tokens), hidden))
    if not tied:
        tensor("output.weight", (len(tokens), hidden))
    gemma = arch in ("gemma3", "gemma2")
    norms = ("attn_norm", "ffn_norm") + (("post_attention_norm", "post_ffw_norm") if gemma else ())
    for name in [f"blk.0.{n}.weight" for n in norms] + ["output_norm.weight"]:
        tensor(name, (hidden,))
    if arch == "phi3":
        tensor("blk.0.attn_qkv.weight", (q + 2 * kv, hidden))
    else:
        tensor("blk.0.attn_q.weight", (q, hidden))
        tensor("blk.0.attn_k.weight", (kv, hidden))
        tensor("blk.0.attn_v.weight", (kv, hidden))
    if arch == "qwen2":
        for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            tensor(f"blk.0.{name}.bias", (n,))
    if arch in ("qwen3", "gemma3"):
        tensor("blk.0.attn_q_norm.weight", (head,))
        tensor("blk.0.attn_k_norm.weight", (head,))
    tensor("blk.0.attn_output.weight", (hidden, q))
    if arch == "phi3":
        tensor("blk.0.ffn_up.weight", (2 * ffn, hidden))
    else:
        tensor("blk.0.ffn_gate.weight", (ffn, hidden))
        tensor("blk.0.ffn_up.weight", (ffn, hidden))
    tensor("blk.0.ffn_down.weight", (hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# K-quant blocks gguf cannot make: (bytes per block of 256, byte offsets of the fp16 fields)
K_BLOCKS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)),
            "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def random_k_blocks(rng, shape: tuple[int, int], qname: str, scale: float = 0.01):
    """Raw ``qname`` bytes ``[rows, row bytes]`` for a ``shape`` weight: random blocks whose fp16
    fields (``d``, ``dmin``) are finite (any other byte pattern is a valid block)."""
    import numpy as np

    rows, k = shape
    size, fields = K_BLOCKS[qname]
    raw = rng.integers(0, 256, size=(rows, k // 256, size), dtype=np.uint8)
    for at in fields:
        v = np.abs(rng.standard_normal((rows, k // 256)) * scale).astype(np.float16)
        raw[..., at:at + 2] = v.view(np.uint8).reshape(rows, k // 256, 2)
    return raw.reshape(rows, -1)


def random_q4_k(rng, shape: tuple[int, int], scale: float = 0.01):
    return random_k_blocks(rng, shape, "Q4_K", scale)


def tiny_llama_dir(src: Path) -> Path:
    """``src`` (created): a one-layer bf16 llama safetensors directory (hidden 128, vocab 512,
    tied head) with a config and a stub tokenizer, that ``vllm-edge quantize`` takes."""
    import torch
    from safetensors.torch import save_file

    src.mkdir()
    h, inter, vocab = 128, 256, 512
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
           "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": vocab, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16"}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer.json").write_text("{}")
    t = {"model.embed_tokens.weight": torch.randn(vocab, h), "model.norm.weight": torch.ones(h),
         "model.layers.0.input_layernorm.weight": torch.ones(h)}
    for name, shape in {"self_attn.q_proj": (h, h), "self_attn.k_proj": (64, h),
                        "self_attn.v_proj": (64, h), "self_attn.o_proj": (h, h),
                        "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
                        "mlp.down_proj": (h, inter)}.items():
        t[f"model.layers.0.{name}.weight"] = torch.randn(shape) * 0.05
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in t.items()}, str(src / "model.safetensors"))
    return src

