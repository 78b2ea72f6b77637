"""transformers as the vLLM-free reference engine on a safetensors directory.

Same interface as :class:`~vllm_edge.bench.engines.llamacpp.LlamaCppRunner`
(token ids in, argmax tokens or logits out). ``dtype`` is the compute dtype;
float32 on bf16 weights checks the conversion without bf16 activation noise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np


class HfRunner:
    def __init__(self, model_dir: str | os.PathLike, *, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(model_dir)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=getattr(torch, dtype))
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        self.dtype = dtype

    def close(self) -> None:
        del self.model

    def greedy(self, prompt: Sequence[int], max_tokens: int, eos: int | None = None) -> list[int]:
        torch = self.torch
        out: list[int] = []
        with torch.inference_mode():
            res = self.model(input_ids=torch.tensor([list(prompt)]), use_cache=True)
            while True:
                tok = int(res.logits[0, -1].float().argmax())
                out.append(tok)
                if len(out) >= max_tokens or tok == eos:
                    return out
                res = self.model(input_ids=torch.tensor([[tok]]), past_key_values=res.past_key_values,
                                 use_cache=True)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            res = self.model(input_ids=torch.tensor([list(ids)]), use_cache=False)
        return res.logits[0].float().numpy().copy()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode(text)

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_token_id
