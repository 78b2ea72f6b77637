"""An offline vision-language checkpoint: Idefics3 (the SmolVLM architecture) built
around the embedded SmolLM2-135M (docs/guide/multimodal.md).

- Language model: SmolLM2's real weights, renamed under ``model.text_model``.
- Vision encoder (SigLIP-shaped) and connector: seeded random weights at real shapes
  (SmolVLM-256M's by default: hidden 768, 12 layers, patch 16, image 512, pixel-shuffle 4,
  so 64 image tokens per 512x512 tile). Its "vision" is noise by construction; it exists
  for parity, speed and memory, not for describing pictures.
- Tokenizer: SmolLM2's plus Idefics3's image tokens (``<fake_token_around_image>``,
  ``<image>``, ``<end_of_utterance>``, ``<global-img>``, ``<row_R_col_C>`` for R, C in
  1..6): 40 new ids from 49152. The embedding and the (untied) head grow to a vocabulary
  padded to a multiple of 64 (49216); new and padding rows are the mean of SmolLM2's
  embedding rows, so they neither dominate nor vanish in the logits.
- Processor: ``Idefics3Processor`` with the PIL image processor
  (``Idefics3ImageProcessorPil``), which transformers loads without torchvision.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from vllm_edge import envs
from vllm_edge.common import atomic, manifest
from vllm_edge.quant import formats
from vllm_edge.quant.groups import DEFAULT_GROUP

CONVERTER_VERSION = "vlm/1"
KIND = CONVERTER_VERSION.split("/")[0]
KEY = "smolvlm-135m"
VOCAB_MULTIPLE = 64
LINEAR_STD = 0.02  # SigLIP's initializer range
FAKE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
END_OF_UTTERANCE = "<end_of_utterance>"
GLOBAL_IMG = "<global-img>"
GRID = 6  # Idefics3Processor looks up <row_1_col_1> .. <row_6_col_6>

# ChatML (SmolLM2's own format), with OpenAI-style content lists: an image part becomes
# the <image> placeholder that the processor expands.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ['image', 'image_url'] %}{{ '<image>' }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def image_tokens() -> list[str]:
    grid = [f"<row_{r + 1}_col_{c + 1}>" for r in range(GRID) for c in range(GRID)]
    return [FAKE_TOKEN, IMAGE_TOKEN, END_OF_UTTERANCE, GLOBAL_IMG, *grid]


@dataclass(frozen=True)
class VisionShape:
    hidden: int = 768
    layers: int = 12
    intermediate: int = 3072
    heads: int = 12
    patch: int = 16
    image_size: int = 512
    scale_factor: int = 4
    # the processor's resize target; above image_size, images are split into tiles
    longest_edge: int = 512

    def validate(self) -> None:
        if min(asdict(self).values()) < 1:
            raise ValueError(f"every vision dimension must be positive: {self}")
        if self.hidden % self.heads:
            raise ValueError(f"vision hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.image_size % self.patch:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch {self.patch}")
        side = self.image_size // self.patch
        if side % self.scale_factor:
            raise ValueError(f"{side} patches per side are not divisible by scale_factor "
                             f"{self.scale_factor} (pixel shuffle)")
        if self.longest_edge < self.image_size:
            raise ValueError(f"longest_edge {self.longest_edge} is below image_size {self.image_size}")

    @property
    def image_seq_len(self) -> int:
        """Tokens per tile after the pixel shuffle."""
        return (self.image_size // self.patch) ** 2 // self.scale_factor ** 2

    def tensors(self, text_hidden: int) -> Iterator[tuple[str, tuple[int, ...]]]:
        h, p = self.hidden, "model.vision_model"
        yield f"{p}.embeddings.patch_embedding.weight", (h, 3, self.patch, self.patch)
        yield f"{p}.embeddings.patch_embedding.bias", (h,)
        yield f"{p}.embeddings.position_embedding.weight", ((self.image_size // self.patch) ** 2, h)
        for i in range(self.layers):
            lp = f"{p}.encoder.layers.{i}"
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                yield f"{lp}.self_attn.{proj}.weight", (h, h)
                yield f"{lp}.self_attn.{proj}.bias", (h,)
            yield f"{lp}.mlp.fc1.weight", (self.intermediate, h)
            yield f"{lp}.mlp.fc1.bias", (self.intermediate,)
            yield f"{lp}.mlp.fc2.weight", (h, self.intermediate)
            yield f"{lp}.mlp.fc2.bias", (h,)
            for ln in ("layer_norm1", "layer_norm2"):
                yield f"{lp}.{ln}.weight", (h,)
                yield f"{lp}.{ln}.bias", (h,)
        yield f"{p}.post_layernorm.weight", (h,)
        yield f"{p}.post_layernorm.bias", (h,)
        yield "model.connector.modality_projection.proj.weight", (text_hidden, h * self.scale_factor ** 2)


def padded_vocab(n: int) -> int:
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def idefics3_config(text_cfg: dict, vision: VisionShape, vocab: int, image_token_id: int) -> dict:
    text = {k: v for k, v in text_cfg.items()
            if k not in ("architectures", "_model_name_or_path", "transformers_version", "dtype")}
    text.update({"vocab_size": vocab, "tie_word_embeddings": False, "model_type": "llama"})
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": image_token_id,
        "scale_factor": vision.scale_factor,
        "tie_word_embeddings": False,
        "pad_token_id": text_cfg.get("pad_token_id"),
        "bos_token_id": text_cfg.get("bos_token_id"),
        "eos_token_id": text_cfg.get("eos_token_id"),
        "dtype": "bfloat16",
        "text_config": text,
        "vision_config": {
            "model_type": "idefics3_vision",
            "hidden_size": vision.hidden,
            "intermediate_size": vision.intermediate,
            "num_hidden_layers": vision.layers,
            "num_attention_heads": vision.heads,
            "num_channels": 3,
            "patch_size": vision.patch,
            "image_size": vision.image_size,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "attention_dropout": 0.0,
            "initializer_range": LINEAR_STD,
        },
    }


def _vision_tensor(name: str, shape: tuple[int, ...], gen, connector_std: float):
    import torch

    if len(shape) == 1:  # LayerNorm weight 1, every bias 0: a freshly initialised SigLIP
        fill = 1.0 if name.endswith("norm1.weight") or name.endswith("norm2.weight") \
            or name.endswith("post_layernorm.weight") else 0.0
        return torch.full(shape, fill, dtype=torch.bfloat16)
    std = connector_std if name.startswith("model.connector.") else LINEAR_STD
    return (torch.randn(shape, generator=gen) * std).to(torch.bfloat16)


def _save_processor(tmp: Path, src: Path, vision: VisionShape) -> dict[str, int]:
    from transformers import AutoTokenizer, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok = AutoTokenizer.from_pretrained(str(src))
    base = len(tok)
    added = tok.add_special_tokens({"additional_special_tokens": image_tokens()},
                                   replace_extra_special_tokens=False)
    if added != len(image_tokens()):
        raise ValueError(f"{src}: expected to add {len(image_tokens())} image tokens, added {added} "
                         "(some already exist in the tokenizer)")
    ids = {t: tok.convert_tokens_to_ids(t) for t in image_tokens()}
    if sorted(ids.values()) != list(range(base, base + len(ids))):
        raise ValueError(f"image tokens did not get consecutive ids from {base}: {ids}")
    image_proc = Idefics3ImageProcessorPil(
        do_image_splitting=True, size={"longest_edge": vision.longest_edge},
        max_image_size={"longest_edge": vision.image_size},
    )
    proc = Idefics3Processor(image_processor=image_proc, tokenizer=tok,
                             image_seq_len=vision.image_seq_len, chat_template=CHAT_TEMPLATE)
    proc.save_pretrained(str(tmp))
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(tmp))
    return {"base_vocab": base, "tokens": len(tok), **{"image_token_id": ids[IMAGE_TOKEN]}}


def build(out: str | Path, *, text_dir: str | Path, vision: VisionShape = VisionShape(),
          seed: int = 0, force: bool = False) -> Path:
    """Write the bf16 Idefics3 checkpoint to ``out`` (atomically); returns ``out``."""
    import torch
    from safetensors.torch import save_file

    from vllm_edge.quant.quantize import load_ref, tensor_refs

    vision.validate()
    out, src = Path(out).expanduser(), Path(text_dir)
    from vllm_edge.common import model_config

    text_cfg = model_config.read(src / "config.json")
    if text_cfg.get("model_type") != "llama":
        raise ValueError(f"{src}: the language model must be a Llama checkpoint, got "
                         f"model_type={text_cfg.get('model_type')!r}")
    text_hidden = int(text_cfg["hidden_size"])
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    with atomic.directory(out, kind=KIND, inputs=[src], force=force) as tmp:
        tok_info = _save_processor(tmp, src, vision)
        vocab = padded_vocab(tok_info["tokens"])
        for name, ref in tensor_refs(src):
            if name == "lm_head.weight":
                continue  # the head is rebuilt from the resized embedding below
            if not name.startswith("model."):
                raise ValueError(f"{ref[0]}: unexpected tensor {name}")
            tensors["model.text_model." + name[len("model."):]] = load_ref(ref)
        emb = tensors["model.text_model.embed_tokens.weight"]
        if emb.shape[0] != tok_info["base_vocab"]:
            raise ValueError(f"{src}: embedding has {emb.shape[0]} rows but the tokenizer "
                             f"{tok_info['base_vocab']} tokens")
        mean = emb.float().mean(0, keepdim=True)
        grown = torch.cat([emb, mean.expand(vocab - emb.shape[0], -1).to(emb.dtype)]).contiguous()
        tensors["model.text_model.embed_tokens.weight"] = grown
        tensors["lm_head.weight"] = grown.clone()  # untied: both engines read the same head
        # Scale the connector so image embeddings have the spread of token embeddings
        # (the vision tower ends in a LayerNorm, so its outputs have unit spread).
        emb_std = float(emb.float().std())
        conn_in = vision.hidden * vision.scale_factor ** 2
        connector_std = emb_std / math.sqrt(conn_in)
        for name, shape in vision.tensors(text_hidden):
            tensors[name] = _vision_tensor(name, shape, gen, connector_std)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        cfg = idefics3_config(text_cfg, vision, vocab, tok_info["image_token_id"])
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        if (src / "generation_config.json").exists():
            (tmp / "generation_config.json").write_text((src / "generation_config.json").read_text())
        text_manifest = manifest.read(src)
        n_vision = sum(math.prod(s) for _, s in vision.tensors(text_hidden))
        manifest.write(tmp, {
            "converter": CONVERTER_VERSION, "source": str(src),
            "source_sha256": text_manifest.get("source_sha256"),
            "text_converter": text_manifest.get("converter"),
            "seed": seed, "vision": asdict(vision), "vision_parameters": n_vision,
            "vocab": {"tokenizer": tok_info["tokens"], "padded": vocab,
                      "base": tok_info["base_vocab"], "image_token_id": tok_info["image_token_id"]},
            "connector_std": connector_std, "dtype": "bfloat16",
        })
    return out


# --- the cached build -------------------------------------------------------------

def prepared_dir() -> Path:
    return envs.home() / "models" / f"{KEY}-bf16"


def vision_formats() -> list[str]:
    """The weight formats a VLM can be built in (the registry's ``vision`` formats)."""
    return [f.name for f in formats.all_formats() if f.vision]


def quantized_dir(scheme: str, group: int = DEFAULT_GROUP, quantize_vision: bool = False) -> Path:
    tag = "-vision" if quantize_vision else ""
    return envs.home() / "models" / f"{KEY}-{scheme}-g{group}{tag}"


def parse_key(name: str) -> tuple[str | None, int, bool] | None:
    """``smolvlm-135m`` -> (None, 64, False); ``smolvlm-135m-FORMAT-gGROUP[-vision]`` (a vision
    format of the registry at one of its groups) -> (FORMAT, GROUP, vision); anything else ->
    None. The names are the cache directories'."""
    if name == KEY:
        return None, 64, False
    names = "|".join(map(re.escape, vision_formats()))
    m = re.fullmatch(re.escape(KEY) + rf"-({names})-g(\d+)(-vision)?", name)
    if not m or int(m.group(2)) not in formats.get(m.group(1)).groups:
        return None
    return m.group(1), int(m.group(2)), bool(m.group(3))


def prepare(text: Path, *, force: bool = False) -> Path:
    """Build the default VLM around the converted SmolLM2 in ``text``, once."""
    out = prepared_dir()
    want = {"converter": CONVERTER_VERSION, "source_sha256": manifest.read(text).get("source_sha256"),
            "vision": asdict(VisionShape())}
    with atomic.lock(out):
        if not force and manifest.mismatch(out, want) is None:
            return out
        return build(out, text_dir=text, force=force)


def ready(quant: str | None = None, group: int = DEFAULT_GROUP, quantize_vision: bool = False) -> bool:
    """Cheap check: is this build cached from the current converters?"""
    if quant is None:
        return manifest.mismatch(prepared_dir(), {"converter": CONVERTER_VERSION}) is None
    from vllm_edge.quant.quantize import CONVERTER_VERSION as QV

    want = {"converter": f"{QV}+{CONVERTER_VERSION}", "scheme": quant, "group_size": group,
            "quantize_vision": quantize_vision}
    return manifest.mismatch(quantized_dir(quant, group, quantize_vision), want) is None


def prepare_quantized(text: Path, scheme: str, group: int = DEFAULT_GROUP, *,
                      quantize_vision: bool = False, force: bool = False, progress: bool = True) -> Path:
    """Quantize the default VLM once: the language model's linears, embedding and head,
    and the vision tower's linears only when ``quantize_vision``."""
    from vllm_edge.quant.quantize import CONVERTER_VERSION as QV
    from vllm_edge.quant.quantize import quantize_model

    if scheme not in vision_formats():
        raise ValueError(f"the VLM supports --quant {' or '.join(vision_formats())} only, got {scheme!r}")
    bf16 = prepare(text)
    out = quantized_dir(scheme, group, quantize_vision)
    base = manifest.read(bf16)
    want = {"source": str(bf16), "source_sha256": base.get("source_sha256"),
            "converter": f"{QV}+{CONVERTER_VERSION}", "scheme": scheme, "group_size": group,
            "quantize_vision": quantize_vision}
    with atomic.lock(out):
        if not force and manifest.mismatch(out, want) is None:
            return out
        return quantize_model(bf16, out, scheme=scheme, group=group, quantize_vision=quantize_vision,
                              progress=progress, manifest=want, force=force)
