"""llama.cpp (via llama-cpp-python) as a token-in, logits-out engine.

Prompts are token ids, never text, so llama.cpp and the engine it is compared
with read exactly the same sequence whatever their tokenizers do. Every call
starts from an empty context (``reset``), so nothing is reused between calls.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

SKIP_REASON = "llama-cpp-python is not installed (pip install 'vllm-edge[baselines]')"


def available() -> bool:
    # find_spec, not import: the arm times the import as part of its load.
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppRunner:
    def __init__(self, gguf: str | os.PathLike, *, n_ctx: int, threads: int | None = None,
                 all_logits: bool = False, use_mmap: bool = True):
        from llama_cpp import Llama

        self.path = Path(gguf)
        threads = threads or len(os.sched_getaffinity(0))
        self.llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, logits_all=all_logits, use_mmap=use_mmap,
                         verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.n_ctx = n_ctx
        self.all_logits = all_logits

    def close(self) -> None:
        self.llm.close()

    def _check_len(self, n: int) -> None:
        if n > self.n_ctx:
            raise ValueError(f"{n} positions do not fit n_ctx={self.n_ctx}")

    def last_logits(self) -> np.ndarray:
        import llama_cpp

        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def greedy(self, prompt: Sequence[int], max_tokens: int, eos: int | None = None) -> list[int]:
        """Argmax decoding; stops after ``eos`` if given (it is included)."""
        self._check_len(len(prompt) + max_tokens)
        self.llm.reset()
        self.llm.eval(list(prompt))
        out: list[int] = []
        while True:
            tok = int(np.argmax(self.last_logits()))
            out.append(tok)
            if len(out) >= max_tokens or tok == eos:
                return out
            self.llm.eval([tok])

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """[len(ids), vocab] logits, one row per input position (float32 copy)."""
        if not self.all_logits:
            raise RuntimeError("construct the runner with all_logits=True for per-position logits")
        self._check_len(len(ids))
        self.llm.reset()
        self.llm.eval(list(ids))
        return np.array(self.llm.scores[:len(ids)], dtype=np.float32, copy=True)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenizer, special tokens parsed, no BOS added."""
        return self.llm.tokenize(text.encode(), add_bos=False, special=True)


@contextmanager
def runner(gguf: str | os.PathLike, **kwargs) -> Iterator[LlamaCppRunner]:
    r = LlamaCppRunner(gguf, **kwargs)
    try:
        yield r
    finally:
        r.close()


def quantization_types(gguf: str | os.PathLike) -> set[str]:
    """The GGML types of the file's 2-D (matrix) tensors."""
    import gguf as gg

    reader = gg.GGUFReader(str(gguf))
    return {t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2}


def is_quantized(gguf: str | os.PathLike) -> bool:
    return bool(quantization_types(gguf) - {"F32", "F16", "BF16"})
