"""A tiny Llama folder for the NPU tests: the default model's tokenizer, two layers of random
weights (peaked logits: unit embeddings tied to the head)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def tiny_llama(default_model_dir: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((default_model_dir / "config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(default_model_dir / f, out / f)
    g = torch.Generator().manual_seed(0)

    def w(*shape, scale=0.08):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    ones = torch.ones(64, dtype=torch.bfloat16)
    t = {"model.embed_tokens.weight": w(cfg["vocab_size"], 64, scale=1.0), "model.norm.weight": ones}
    for i in range(2):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": ones.clone(), p + "post_attention_layernorm.weight": ones.clone(),
                  p + "self_attn.q_proj.weight": w(64, 64), p + "self_attn.k_proj.weight": w(32, 64),
                  p + "self_attn.v_proj.weight": w(32, 64), p + "self_attn.o_proj.weight": w(64, 64),
                  p + "mlp.gate_proj.weight": w(128, 64), p + "mlp.up_proj.weight": w(128, 64),
                  p + "mlp.down_proj.weight": w(64, 128)})
    save_file(t, str(out / "model.safetensors"))
    return out
