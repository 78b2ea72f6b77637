"""A Llama decoder as a small functional torch module with the KV cache outside it.

The form a phone NPU runtime loads: every shape fixed, nothing stateful. One call takes a
chunk of ``chunk`` tokens (``chunk`` = 1 is the decode graph, more is a prefill graph):

- ``input_ids`` int32 [1, chunk]; ``position_ids`` int32 [1, chunk] (the absolute positions);
- ``attention_mask`` float32 [1, 1, chunk, context]: 0 where a query may look, ``MASK_VALUE``
  where it may not. Columns ``0 .. past-1`` are the cache slots, the last ``chunk`` columns
  the chunk itself (causal within it);
- ``past_key.{i}`` / ``past_value.{i}`` float32 [1, n_kv, past, head_dim] per layer, where
  ``past = context - chunk``; keys are stored after RoPE.

It returns ``logits`` float32 [1, chunk, vocab] and ``present_key.{i}`` /
``present_value.{i}`` [1, n_kv, chunk, head_dim]: the chunk's own keys and values, which the
caller writes into its cache at the chunk's positions.

RoPE angles are a constant table gathered by position (``context`` rows), so no Sin/Cos runs
on the device and the quantized table keeps 16-bit precision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vllm_edge.models.npu.errors import NpuExportError

# A large negative additive mask: exp(-100) is 0 in any precision the graph runs in, and a
# small range keeps the 16-bit scale of the attention scores fine.
MASK_VALUE = -100.0


@dataclass(frozen=True)
class LlamaShape:
    n_layer: int
    hidden: int
    intermediate: int
    n_head: int
    n_kv: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_theta: float
    tied: bool
    max_positions: int


def read_shape(src: Path) -> LlamaShape:
    """The shape of the Llama checkpoint in ``src``; refuses what this exporter cannot write."""
    p = src / "config.json"
    if not p.is_file():
        raise NpuExportError(f"{src}: no config.json; export-npu needs a bf16 Llama folder")
    cfg = json.loads(p.read_text())
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" or archs != ["LlamaForCausalLM"]:
        raise NpuExportError(
            f"{src}: model_type {cfg.get('model_type')!r} / architectures {archs}: export-npu "
            "writes the Llama family only (LlamaForCausalLM)")
    if cfg.get("quantization_config"):
        raise NpuExportError(f"{src}: the checkpoint is quantized; export-npu needs bf16/f16/f32 weights")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise NpuExportError(f"{src}: attention or MLP biases are not supported by export-npu")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NpuExportError(f"{src}: hidden_act {cfg.get('hidden_act')!r}: export-npu writes silu only")
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rtype = rp.get("rope_type", rp.get("type", "default"))
    if rtype not in ("default", None):
        raise NpuExportError(f"{src}: rope scaling {rtype!r} is not supported by export-npu")
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise NpuExportError(f"{src}: config.json has no rope_theta")
    n_head = int(cfg["num_attention_heads"])
    return LlamaShape(
        n_layer=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]),
        intermediate=int(cfg["intermediate_size"]), n_head=n_head,
        n_kv=int(cfg.get("num_key_value_heads") or n_head),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // n_head),
        vocab=int(cfg["vocab_size"]), rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), tied=bool(cfg.get("tie_word_embeddings", False)),
        max_positions=int(cfg.get("max_position_embeddings") or 2048))


def load_weights(src: Path, shape: LlamaShape) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in float32, by their Hugging Face names."""
    from safetensors.torch import load_file

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise NpuExportError(f"{src}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            weights[name] = t.float()
    if "lm_head.weight" not in weights:
        if not shape.tied:
            raise NpuExportError(f"{src}: no lm_head.weight and the embedding is not tied")
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


def rope_tables(shape: LlamaShape, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [context, head_dim] for positions ``0 .. context-1`` (the rotate-half form)."""
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float64)
                                      / shape.head_dim))
    ang = torch.arange(context, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


class _RmsNorm(torch.autograd.Function):
    """RMSNorm that exports as one ``SimplifiedLayerNormalization`` node (onnxruntime's RMSNorm,
    which the QNN EP maps to the HTP's RmsNorm). Spelled out as Mul/ReduceMean/Sqrt, the
    squared residual (up to ~1e6 in small Llamas) would be quantized to 16 bits on one scale
    and every ordinary token's variance would round to zero."""

    @staticmethod
    def forward(ctx, x, w, eps):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    @staticmethod
    def symbolic(g, x, w, eps):
        return g.op("SimplifiedLayerNormalization", x, w, axis_i=-1, epsilon_f=eps, stash_type_i=1)


class NpuLlama(nn.Module):
    """The decoder with explicit KV inputs and outputs (see the module docstring)."""

    def __init__(self, shape: LlamaShape, weights: dict[str, torch.Tensor], context: int):
        super().__init__()
        self.shape, self.context = shape, context
        cos, sin = rope_tables(shape, context)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.embed = nn.Parameter(weights["model.embed_tokens.weight"].clone(), requires_grad=False)
        # its own copy even when tied: the gather table and the head matrix quantize apart
        self.head = nn.Parameter(weights["lm_head.weight"].t().contiguous().clone(), requires_grad=False)
        self.norm = nn.Parameter(weights["model.norm.weight"].clone(), requires_grad=False)
        self.layers = nn.ModuleList()
        for i in range(shape.n_layer):
            p = f"model.layers.{i}."
            layer = nn.Module()
            for name, key in (("ln1", "input_layernorm.weight"), ("ln2", "post_attention_layernorm.weight")):
                setattr(layer, name, nn.Parameter(weights[p + key].clone(), requires_grad=False))
            # stored transposed, [in, out]: x @ w is one MatMul with a constant right side
            for name, key in (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
                              ("o", "self_attn.o_proj"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"),
                              ("down", "mlp.down_proj")):
                setattr(layer, name, nn.Parameter(weights[p + key + ".weight"].t().contiguous().clone(),
                                                  requires_grad=False))
            self.layers.append(layer)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _RmsNorm.apply(x, w, self.shape.rms_eps)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def forward(self, input_ids, position_ids, attention_mask, *past):
        s = self.shape
        chunk = input_ids.shape[1]
        groups = s.n_head // s.n_kv
        x = self.embed[input_ids[0]][None]                       # [1, T, hidden]
        cos = self.cos[position_ids[0]][None, None]               # [1, 1, T, D]
        sin = self.sin[position_ids[0]][None, None]
        # queries grouped by their KV head: [1, n_kv, groups*T, D]; the mask repeats to match
        mask = attention_mask.repeat(1, 1, groups, 1)             # [1, 1, groups*T, C]
        scale = 1.0 / float(s.head_dim) ** 0.5
        presents = []
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer.ln1)
            q = (h @ layer.q).view(1, chunk, s.n_head, s.head_dim).transpose(1, 2)
            k = (h @ layer.k).view(1, chunk, s.n_kv, s.head_dim).transpose(1, 2)
            v = (h @ layer.v).view(1, chunk, s.n_kv, s.head_dim).transpose(1, 2)
            q = self._rotate(q, cos, sin) * scale
            k = self._rotate(k, cos, sin)
            keys = torch.cat([past[2 * i], k], dim=2)             # [1, n_kv, C, D]
            values = torch.cat([past[2 * i + 1], v], dim=2)
            q = q.reshape(1, s.n_kv, groups * chunk, s.head_dim)
            scores = q @ keys.transpose(2, 3) + mask               # [1, n_kv, groups*T, C]
            probs = torch.softmax(scores, dim=-1)
            att = (probs @ values).reshape(1, s.n_head, chunk, s.head_dim)
            att = att.transpose(1, 2).reshape(1, chunk, s.n_head * s.head_dim)
            x = x + att @ layer.o
            h = self._rms(x, layer.ln2)
            x = x + (torch.nn.functional.silu(h @ layer.gate) * (h @ layer.up)) @ layer.down
            presents += [k, v]
        logits = self._rms(x, self.norm) @ self.head
        return (logits, *presents)


def io_names(n_layer: int) -> tuple[list[str], list[str]]:
    """The graph's input and output names, in order."""
    ins = ["input_ids", "position_ids", "attention_mask"]
    outs = ["logits"]
    for i in range(n_layer):
        ins += [f"past_key.{i}", f"past_value.{i}"]
        outs += [f"present_key.{i}", f"present_value.{i}"]
    return ins, outs
