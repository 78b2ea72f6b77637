"""llama.cpp through llama-cpp-python's own generation loop, plain or with its prompt-lookup
proposer (``LlamaPromptLookupDecoding``): greedy answers to token ids, up to the end of turn.

Both arms go through the same ``Llama.generate`` loop, so the proposer is the only
difference between them. With a draft model llama-cpp-python evaluates the proposals with the
last token in one batch and keeps them up to the first one its own greedy choice differs from,
so greedy answers are the plain ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

# llama-cpp-python's documentation of LlamaPromptLookupDecoding: 10 proposed tokens suit a GPU,
# 2 "performs better for cpu-only machines".
LOOKUP_TOKENS = 2
LOOKUP_NGRAM = 2  # its default longest match


class LlamaCppGenerator:
    def __init__(self, gguf: str | os.PathLike, *, lookup: bool, n_ctx: int = 1024,
                 threads: int | None = None):
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.path = Path(gguf)
        threads = threads or len(os.sched_getaffinity(0))
        draft = (LlamaPromptLookupDecoding(max_ngram_size=LOOKUP_NGRAM, num_pred_tokens=LOOKUP_TOKENS)
                 if lookup else None)
        self.lookup = lookup
        self.llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, draft_model=draft, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_ctx = n_ctx

    def settings(self) -> dict:
        return ({"method": "llama-cpp-python LlamaPromptLookupDecoding",
                 "max_ngram_size": LOOKUP_NGRAM, "num_pred_tokens": LOOKUP_TOKENS}
                if self.lookup else {"method": "off"})

    def answer(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """Greedy tokens after ``prompt``, the end-of-turn token included when reached (as
        vLLM's answers include it). Nothing of an earlier answer is reused."""
        import llama_cpp

        if len(prompt) + max_tokens > self.n_ctx:
            raise ValueError(f"{len(prompt)} + {max_tokens} positions do not fit n_ctx={self.n_ctx}")
        self.llm.reset()  # otherwise generate() keeps the shared prefix and skips its prefill
        out: list[int] = []
        for tok in self.llm.generate(list(prompt), temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                     repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if llama_cpp.llama_vocab_is_eog(self.vocab, int(tok)) or len(out) >= max_tokens:
                break
        return out

    def close(self) -> None:
        self.llm.close()
