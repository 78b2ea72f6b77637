"""A bf16 checkpoint with random weights, for speed and memory measurements at sizes the
embedded model does not reach (the 1B shape: hidden 2048, 16 layers, vocabulary 49152, tied
head, ~1B parameters), and for running architectures we have no real weights of.

Architectures (``arch``): ``llama`` (LlamaForCausalLM), ``qwen2`` (Qwen2ForCausalLM: a
Llama block plus q/k/v biases) and ``qwen3`` (Qwen3ForCausalLM: no biases, RMSNorm on the
per-head queries and keys). Same tensor shapes otherwise.

Tensors are generated and written one shard at a time (one shard resident, never the
whole model), into an atomically renamed directory. The tokenizer and chat template come
from a real model directory (by default the embedded one, whose vocabulary is 49152), so
vLLM loads and runs it; the text it produces is noise by construction.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from vllm_edge.common import atomic, manifest

logger = logging.getLogger("vllm_edge.models")
CONVERTER_VERSION = "synthetic/2"
KIND = CONVERTER_VERSION.split("/")[0]
ARCHES = ("llama", "qwen2", "qwen3")
# Trained Qwen2 q/k/v biases are O(1) while its weights are O(0.02); a bias this size also
# makes a dropped bias visible in the output (tests/quant/test_second_arch_engine.py).
QWEN2_BIAS_STD = 0.5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")
INIT_STD = 0.02  # the Llama initializer_range


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    tied: bool = True
    arch: str = "llama"

    @classmethod
    def derive(cls, hidden: int, layers: int, vocab: int, intermediate: int | None = None,
               heads: int | None = None, kv_heads: int | None = None, tied: bool = True,
               arch: str = "llama") -> "Shape":
        """Llama-3.2-1B's ratios: MLP 2.75x hidden (rounded to 256), head dim 64, 4 queries per KV head."""
        heads = heads or max(1, hidden // 64)
        kv_heads = kv_heads or max(1, heads // 4)
        intermediate = intermediate or max(256, round(hidden * 2.75 / 256) * 256)
        s = cls(hidden, layers, vocab, intermediate, heads, kv_heads, tied, arch)
        s.validate()
        return s

    def validate(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"arch {self.arch!r} is not one of {', '.join(ARCHES)}")
        if min(self.hidden, self.layers, self.vocab, self.intermediate, self.heads, self.kv_heads) < 1:
            raise ValueError(f"every dimension must be positive: {self}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) in file order: embedding, layers, final norm, head."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        yield "model.embed_tokens.weight", (self.vocab, h)
        for i in range(self.layers):
            p = f"model.layers.{i}"
            yield f"{p}.input_layernorm.weight", (h,)
            yield f"{p}.self_attn.q_proj.weight", (h, h)
            yield f"{p}.self_attn.k_proj.weight", (kv, h)
            yield f"{p}.self_attn.v_proj.weight", (kv, h)
            if self.arch == "qwen2":
                yield f"{p}.self_attn.q_proj.bias", (h,)
                yield f"{p}.self_attn.k_proj.bias", (kv,)
                yield f"{p}.self_attn.v_proj.bias", (kv,)
            if self.arch == "qwen3":
                yield f"{p}.self_attn.q_norm.weight", (self.head_dim,)
                yield f"{p}.self_attn.k_norm.weight", (self.head_dim,)
            yield f"{p}.self_attn.o_proj.weight", (h, h)
            yield f"{p}.post_attention_layernorm.weight", (h,)
            yield f"{p}.mlp.gate_proj.weight", (self.intermediate, h)
            yield f"{p}.mlp.up_proj.weight", (self.intermediate, h)
            yield f"{p}.mlp.down_proj.weight", (h, self.intermediate)
        yield "model.norm.weight", (h,)
        if not self.tied:
            yield "lm_head.weight", (self.vocab, h)

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for _, s in self.tensors())


def model_config(shape: Shape, base: dict | None = None) -> dict:
    """The model config for ``shape.arch``; token ids, rope and norm settings come from ``base``."""
    base = base or {}
    keep = ("bos_token_id", "eos_token_id", "pad_token_id", "rope_theta", "rope_scaling",
            "rms_norm_eps", "max_position_embeddings", "hidden_act")
    cfg = {k: base[k] for k in keep if k in base}
    cfg.setdefault("rms_norm_eps", 1e-5)
    cfg.setdefault("rope_theta", 100000.0)
    cfg.setdefault("max_position_embeddings", 8192)
    cfg.setdefault("hidden_act", "silu")
    cfg.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape.hidden, "num_hidden_layers": shape.layers,
        "vocab_size": shape.vocab, "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim, "tie_word_embeddings": shape.tied,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        "initializer_range": INIT_STD,
    })
    if shape.arch == "qwen2":
        cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                    "use_sliding_window": False, "sliding_window": None,
                    "max_window_layers": shape.layers})
        for k in ("attention_bias", "mlp_bias", "head_dim"):  # implied by the architecture
            cfg.pop(k)
    elif shape.arch == "qwen3":
        cfg.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                    "use_sliding_window": False, "sliding_window": None,
                    "max_window_layers": shape.layers})
        cfg.pop("mlp_bias")
    return cfg


def _shards(shape: Shape, max_shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards: list[list] = [[]]
    size = 0
    for name, s in shape.tensors():
        nbytes = math.prod(s) * 2
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, s))
        size += nbytes
    return shards


def build(out: str | Path, shape: Shape, *, tokenizer_from: str | Path, seed: int = 0,
          max_shard_bytes: int = 512 << 20, progress: bool = True, force: bool = False) -> Path:
    """Write the checkpoint to ``out`` (atomically); returns ``out``. An existing ``out``
    that is not a synthetic build is refused unless ``force``."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    shape.validate()
    out, tok_dir = Path(out).expanduser(), Path(tokenizer_from)
    if not (tok_dir / "tokenizer.json").exists():
        raise FileNotFoundError(f"{tok_dir}: no tokenizer.json to reuse")
    base_cfg = {}
    if (tok_dir / "config.json").exists():
        base_cfg = json.loads((tok_dir / "config.json").read_text())
        if base_cfg.get("vocab_size", shape.vocab) > shape.vocab:
            # token ids past the embedding would index out of range at run time
            logger.warning("%s's tokenizer has vocabulary %d > %d: prompts may hit ids past the "
                           "embedding", tok_dir, base_cfg["vocab_size"], shape.vocab)
    gen = torch.Generator().manual_seed(seed)
    shards = _shards(shape, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    with atomic.directory(out, kind=KIND, inputs=[tok_dir], force=force) as tmp, tqdm(total=shape.parameters, unit="param", unit_scale=True,
                                            desc=f"synthetic {out.name}", disable=not progress) as bar:
        for fname, shard in zip(names, shards):
            tensors = {}
            for name, s in shard:
                if name.endswith(".bias"):
                    t = (torch.randn(s, generator=gen) * QWEN2_BIAS_STD).to(torch.bfloat16)
                elif len(s) == 1:  # RMSNorm weights: ones, as a fresh Llama has
                    t = torch.ones(s, dtype=torch.bfloat16)
                else:
                    t = torch.empty(s, dtype=torch.bfloat16)
                    for r0 in range(0, s[0], 4096):  # fp32 transients stay small
                        rows = t[r0:r0 + 4096]
                        rows.copy_(torch.randn(rows.shape, generator=gen) * INIT_STD)
                tensors[name] = t
                weight_map[name] = fname
                bar.update(t.numel())
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
            (tmp / fname).chmod(0o644)
            del tensors
        total = sum(math.prod(s) * 2 for _, s in shape.tensors())
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(model_config(shape, base_cfg), indent=2) + "\n")
        for f in TOKENIZER_FILES:
            if (tok_dir / f).exists():
                shutil.copy2(tok_dir / f, tmp / f)
        manifest.write(tmp, {
            "converter": CONVERTER_VERSION, "source": "random", "source_sha256": None,
            "seed": seed, "shape": asdict(shape), "parameters": shape.parameters,
            "tokenizer_from": str(tok_dir), "dtype": "bfloat16",
        })
    return out
