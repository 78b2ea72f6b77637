"""The GGUF architectures (``general.architecture``) we import and repack, one table each.

A family says, for its GGUF files: which llama.cpp tensor goes to which Hugging Face name and
what its shape must be (from the hyperparameters), which HF class runs it, whether llama.cpp's
convert permuted the q/k rows for its rope (only ``LlamaModel`` and the classes derived from it
do; Qwen2 and Qwen3 use the NEOX rope and keep HF's row order), and whether its norms are
stored as ``1 + w`` (Gemma: HF keeps ``w`` and adds the 1 in the model), whether its head is always the embedding
(Gemma 2: llama.cpp reads no ``output.weight``), and which tensors it refuses by name with the
reason (Phi-3's LongRoPE factors). The bf16 import
(:mod:`.gguf_import`), the cpu_int4 repack (:mod:`.gguf_repack`) and the models guide read
:data:`FAMILIES`; a file of any other architecture is refused by name with this list.

Shapes are in GGUF order (a row's length first), in units of: ``hidden`` (embedding_length),
``ffn`` (feed_forward_length), ``q`` (heads x head size), ``kv`` (KV heads x head size),
``head`` (the head size), ``qkv`` (q + 2 kv: a fused q/k/v, in that row order), ``ffn2`` (2 x ffn:
a fused gate and up, gate rows first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_Shape = tuple[str, ...]


@dataclass(frozen=True)
class Family:
    arch: str                       # general.architecture
    title: str                      # how messages name its checkpoints
    hf_class: str                   # config.architectures[0]
    rope_permuted: bool             # llama.cpp's convert permuted the q/k rows
    layer: dict[str, tuple[str, _Shape]] = field(repr=False)  # in blk.N: GGUF -> (HF in layers.N, shape)
    norm_plus_one: bool = False     # GGUF norms hold 1 + w (HF's w)
    # the metadata key (after "<arch>.") with the head size, when the HF class reads it from
    # the config; None: the class takes hidden / heads
    head_key: str | None = "attention.key_length"
    tied_only: bool = False         # llama.cpp reads the embedding as the head; no output.weight
    partial_rope: bool = False      # rope.dimension_count below the head size is mapped, not refused
    # the switch of the patch (patches/) that makes vLLM's class build its token embedding with
    # the quantization config, which the class does not do by itself; None: it does. With the
    # switch off the repack keeps the embedding bf16, and a tied head with it
    embedding_switch: str | None = None
    # tensors the family's files may carry that we refuse, with the reason quoted
    refused: dict[str, str] = field(default_factory=dict, repr=False)

    def quantized_embedding(self) -> bool:
        """Whether vLLM will build this family's token embedding in a checkpoint's format."""
        from vllm_edge import envs

        return self.embedding_switch is None or bool(envs.get(self.embedding_switch))

    def layer_names(self) -> dict[str, str]:
        return {g: hf for g, (hf, _) in self.layer.items()}


_LLAMA_LAYER = {
    "attn_norm.weight": ("input_layernorm.weight", ("hidden",)),
    "ffn_norm.weight": ("post_attention_layernorm.weight", ("hidden",)),
    "attn_q.weight": ("self_attn.q_proj.weight", ("hidden", "q")),
    "attn_k.weight": ("self_attn.k_proj.weight", ("hidden", "kv")),
    "attn_v.weight": ("self_attn.v_proj.weight", ("hidden", "kv")),
    "attn_output.weight": ("self_attn.o_proj.weight", ("q", "hidden")),
    "ffn_gate.weight": ("mlp.gate_proj.weight", ("hidden", "ffn")),
    "ffn_up.weight": ("mlp.up_proj.weight", ("hidden", "ffn")),
    "ffn_down.weight": ("mlp.down_proj.weight", ("ffn", "hidden")),
}
_QK_NORM = {
    "attn_q_norm.weight": ("self_attn.q_norm.weight", ("head",)),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", ("head",)),
}

LLAMA = Family("llama", "Llama", "LlamaForCausalLM", rope_permuted=True, layer=_LLAMA_LAYER,
               head_key="rope.dimension_count")
QWEN2 = Family("qwen2", "Qwen2", "Qwen2ForCausalLM", rope_permuted=False, head_key=None, layer={
    **_LLAMA_LAYER,
    "attn_q.bias": ("self_attn.q_proj.bias", ("q",)),
    "attn_k.bias": ("self_attn.k_proj.bias", ("kv",)),
    "attn_v.bias": ("self_attn.v_proj.bias", ("kv",)),
})
QWEN3 = Family("qwen3", "Qwen3", "Qwen3ForCausalLM", rope_permuted=False,
               layer={**_LLAMA_LAYER, **_QK_NORM})

# Gemma 3: four norms a block (around attention and around the MLP), q/k norms, the head size
# from attention.key_length; norms stored as 1 + w. The embedding scale (sqrt(hidden)), the
# local/global layer pattern and the local rope base are the model class's and its config's.
GEMMA3 = Family("gemma3", "Gemma 3", "Gemma3ForCausalLM", rope_permuted=False, norm_plus_one=True, layer={
    "attn_norm.weight": ("input_layernorm.weight", ("hidden",)),
    "post_attention_norm.weight": ("post_attention_layernorm.weight", ("hidden",)),
    "ffn_norm.weight": ("pre_feedforward_layernorm.weight", ("hidden",)),
    "post_ffw_norm.weight": ("post_feedforward_layernorm.weight", ("hidden",)),
    **{g: v for g, v in _LLAMA_LAYER.items() if g not in ("attn_norm.weight", "ffn_norm.weight")},
    **_QK_NORM,
})

# Gemma 2: Gemma 3's block without the q/k norms; the head is always the embedding, which vLLM
# 0.32's Gemma2Model builds without the quantization config unless patched
# (patches/gemma2_embedding_quant.py). Attention
# and final logit soft-capping, the sliding window and its local/global alternation and the
# attention scale are config fields (gguf_import.read_config), not tensors.
GEMMA2 = Family("gemma2", "Gemma 2", "Gemma2ForCausalLM", rope_permuted=False, norm_plus_one=True,
                tied_only=True, embedding_switch="VLLM_EDGE_PATCH_GEMMA2_EMBEDDING", layer={g: v for g, v in GEMMA3.layer.items() if g not in _QK_NORM})

_LONGROPE = ("LongRoPE (rope_factors_long/short, the 128k Phi-3 models) is not mapped yet: "
             "nothing here checks it against llama.cpp; use a file without them (the 4k models)")
# Phi-3: llama.cpp's convert keeps HF's fused projections: attn_qkv (q, k, v rows) and ffn_up
# (gate rows, then up: ggml's swiglu takes the first half through the activation), which
# Phi3ForCausalLM loads as qkv_proj and gate_up_proj. NEOX rope, so rows as stored; no biases.
PHI3 = Family("phi3", "Phi-3", "Phi3ForCausalLM", rope_permuted=False, head_key=None, partial_rope=True,
              refused={"rope_factors_long.weight": _LONGROPE, "rope_factors_short.weight": _LONGROPE},
              layer={
    "attn_norm.weight": ("input_layernorm.weight", ("hidden",)),
    "ffn_norm.weight": ("post_attention_layernorm.weight", ("hidden",)),
    "attn_qkv.weight": ("self_attn.qkv_proj.weight", ("hidden", "qkv")),
    "attn_output.weight": ("self_attn.o_proj.weight", ("q", "hidden")),
    "ffn_up.weight": ("mlp.gate_up_proj.weight", ("hidden", "ffn2")),
    "ffn_down.weight": ("mlp.down_proj.weight", ("ffn", "hidden")),
})

FAMILIES: dict[str, Family] = {f.arch: f for f in (LLAMA, QWEN2, QWEN3, GEMMA3, GEMMA2, PHI3)}

# Tensors outside the blocks, for every family; output.weight is absent when the head is tied.
GLOBAL = {"token_embd.weight": ("model.embed_tokens.weight", ("hidden", "vocab")),
          "output_norm.weight": ("model.norm.weight", ("hidden",)),
          "output.weight": ("lm_head.weight", ("hidden", "vocab"))}


def supported() -> str:
    """The architectures we take, for messages and docs: 'llama, qwen2, qwen3'."""
    return ", ".join(FAMILIES)


def family(arch: str) -> Family | None:
    return FAMILIES.get(arch)
