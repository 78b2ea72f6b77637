"""SmolLM2 with its attention heads padded so that tensor parallelism can split it.

SmolLM2-135M has 9 query and 3 KV heads, which vLLM cannot split over 2 ranks. The twin has
12 query and 4 KV heads of the same size (64): the 3 new query heads all read the new KV
head (as q heads 0-8 read KV heads 0-2, three each), and their columns of o_proj are zero,
so they add nothing and the model computes what SmolLM2 computes. It also carries q/k/v and
o biases as Qwen2 does (``attention_bias``): zero on the real heads, random on the padded
ones, so a rank that loaded another rank's bias slice would change the output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

HEADS, KV_HEADS, HEAD_DIM = 12, 4, 64


def build(src: Path, out: Path, seed: int = 0) -> Path:
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    assert dim == HEAD_DIM and heads % kv == 0 and HEADS // KV_HEADS == heads // kv
    gen = torch.Generator().manual_seed(seed)
    state = load_file(str(src / "model.safetensors"))
    hidden = cfg["hidden_size"]
    new: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")):
            base = name.rsplit(".", 1)[0]
            if name.endswith("o_proj.weight"):  # columns of the padded heads are zero
                new[name] = torch.cat([t, t.new_zeros(hidden, (HEADS - heads) * dim)], 1)
                new[f"{base}.bias"] = t.new_zeros(hidden)
                continue
            want = (HEADS if name.endswith("q_proj.weight") else KV_HEADS) * dim
            pad = want - t.shape[0]
            new[name] = torch.cat([t, (torch.randn(pad, hidden, generator=gen) * 0.02).to(t.dtype)])
            new[f"{base}.bias"] = torch.cat([t.new_zeros(t.shape[0]),
                                            torch.randn(pad, generator=gen).to(t.dtype)])
        else:
            new[name] = t
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and f.name not in ("config.json", "vllm_edge_manifest.json"):
            shutil.copy(f, out / f.name)
    cfg.update(num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, attention_bias=True)
    cfg.pop("_model_name_or_path", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(new, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
