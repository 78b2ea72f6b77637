"""The GGUF architectures (``general.architecture``) we import and repack, one table each.

A family says, for its GGUF files: which llama.cpp tensor goes to which Hugging Face name and
what its shape must be (from the hyperparameters), which HF class runs it, whether llama.cpp's
convert permuted the q/k rows for its rope (only ``LlamaModel`` and the classes derived from it
do; Qwen2 and Qwen3 use the NEOX rope and keep HF's row order), and whether its norms are
stored as ``1 + w`` (Gemma: HF keeps ``w`` and adds the 1 in the model). The bf16 import
(:mod:`.gguf_import`), the cpu_int4 repack (:mod:`.gguf_repack`) and the models guide read
:data:`FAMILIES`; a file of any other architecture is refused by name with this list.

Shapes are in GGUF order (a row's length first), in units of: ``hidden`` (embedding_length),
``ffn`` (feed_forward_length), ``q`` (heads x head size), ``kv`` (KV heads x head size),
``head`` (the head size).
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

FAMILIES: dict[str, Family] = {f.arch: f for f in (LLAMA, QWEN2, QWEN3, GEMMA3)}

# Tensors outside the blocks, for every family; output.weight is absent when the head is tied.
GLOBAL = {"token_embd.weight": ("model.embed_tokens.weight", ("hidden", "vocab")),
          "output_norm.weight": ("model.norm.weight", ("hidden",)),
          "output.weight": ("lm_head.weight", ("hidden", "vocab"))}


def supported() -> str:
    """The architectures we take, for messages and docs: 'llama, qwen2, qwen3'."""
    return ", ".join(FAMILIES)


def family(arch: str) -> Family | None:
    return FAMILIES.get(arch)
