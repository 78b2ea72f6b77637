"""The attention sink: the first position's keys and values, computed once in float32 and
shipped with the export, so the quantized graphs never run position 0.

Small Llamas park a massive activation in the residual stream of the first token, whatever
that token is (SmolLM2-135M: about 25,000 in a few channels from layer 3 on, against at most a
few hundred at every other position). The rest of the sequence only reads that position
through its cached keys and values. Inside a 16-bit graph with one scale per tensor, that one
value sets the residual's scale, and every ordinary token's residual is rounded in steps of
about 0.8. With position 0 outside the graphs, the residual spans a few hundred and the steps
are 60 times finer.

This needs a first token that is the same in every sequence: the tokenizer's BOS when it adds
one, else the first token of the chat template (``<|im_start|>`` for SmolLM2). Its keys and
values at position 0 are then constants, and an app writes them into cache slot 0 before the
prompt's first chunk, which starts at position 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vllm_edge.models.npu.errors import NpuExportError

FILE = "sink_kv.npy"
MODES = ("auto", "off")


@dataclass(frozen=True)
class Sink:
    """The sink token and its cache entries: ``kv[2*i]`` / ``kv[2*i+1]`` are layer i's key and
    value, ``[1, n_kv, 1, head_dim]`` float32 (keys after RoPE at position 0)."""

    token: int
    kv: np.ndarray  # [2 * n_layer, 1, n_kv, 1, head_dim]

    def save(self, folder: Path) -> Path:
        path = folder / FILE
        np.save(path, self.kv.astype(np.float32))
        return path


def first_token(tokenizer) -> tuple[int | None, str]:
    """The token every sequence of this model starts with, and where it comes from; ``None``
    (and why) when sequences may start with anything."""
    probes = ("Hello.", "2 + 2 = ?")
    plain = [tokenizer(t)["input_ids"] for t in probes]
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and all(ids and ids[0] == bos for ids in plain):
        return int(bos), "the tokenizer's BOS, which it adds to every sequence"
    if getattr(tokenizer, "chat_template", None):
        firsts = set()
        for t in probes:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            firsts.add((ids["input_ids"] if hasattr(ids, "keys") else ids)[0])
        if len(firsts) == 1:
            return int(firsts.pop()), "the first token of the chat template"
    return None, "the tokenizer adds no BOS and the model has no chat template that starts every prompt"


def compute(model, token: int) -> Sink:
    """``token``'s keys and values at position 0, from the float32 torch module."""
    import torch

    from vllm_edge.models.npu.llama import MASK_VALUE

    s, c = model.shape, model.context
    mask = torch.full((1, 1, 1, c), MASK_VALUE)
    mask[..., -1] = 0.0  # the token sees itself only
    past = [torch.zeros(1, s.n_kv, c - 1, s.head_dim)] * (2 * s.n_layer)
    with torch.no_grad():
        out = model(torch.tensor([[token]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), mask, *past)
    return Sink(int(token), np.stack([t.numpy() for t in out[1:]]).astype(np.float32))


def load(folder: Path, manifest: dict) -> Sink | None:
    """The sink an export's manifest names, or ``None`` for an export without one."""
    entry = manifest.get("sink")
    if not entry:
        return None
    path = Path(folder) / entry["file"]
    if not path.is_file():
        raise NpuExportError(f"{path}: the manifest names this sink file, but it is missing")
    kv = np.load(path)
    s = manifest["shapes"]
    want = (2 * s["n_layer"], 1, s["n_kv_heads"], 1, s["head_dim"])
    if kv.shape != want:
        raise NpuExportError(f"{path}: shape {kv.shape}, the manifest's shapes need {want}")
    return Sink(int(entry["token"]), kv)
