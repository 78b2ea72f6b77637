"""llama.cpp (via llama-cpp-python) as a token-in, logits-out engine.

Prompts are token ids, never text, so llama.cpp and the engine it is compared
with read exactly the same sequence whatever their tokenizers do. Every call
starts from an empty context (``reset``), so nothing is reused between calls.

Several sequences at once (``greedy_batch``) go through llama.cpp's C API, as
its ``llama-batched`` example does: the high-level ``Llama`` object decodes one
sequence, so a second context on the same loaded model holds ``max_seqs``
sequences, and each ``llama_decode`` call takes one token of every sequence,
each under its own sequence id.
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


def last_logits(llm, n_vocab: int) -> np.ndarray:
    """The logits of the last evaluated position of a ``llama_cpp.Llama`` (a view, no copy)."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))


class GrammarGreedy:
    """Greedy decoding under a GBNF grammar, as llama.cpp's own sampler does it (common
    sampling, grammar not first): take the argmax of the raw logits and keep it when the
    grammar accepts it; only when it does not, run the grammar over the whole vocabulary and
    take the argmax of what is left. Same tokens as masking first, and most steps check one
    token instead of every token (llama-cpp-python's ``create_completion`` masks first)."""

    def __init__(self, model, grammar: str):
        import ctypes

        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(model)
        self.smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not self.smpl:
            raise ValueError("llama.cpp rejected the grammar")
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self._one = (llama_cpp.llama_token_data * 1)()
        self._all = (llama_cpp.llama_token_data * self.n_vocab)()
        self._all_np = np.frombuffer(self._all, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        self._all_np["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._byref = ctypes.byref
        self.full_masks = 0  # steps where the argmax was rejected and the whole vocabulary checked

    def _apply(self, data, size: int) -> None:
        import llama_cpp

        arr = llama_cpp.llama_token_data_array(data=data, size=size, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.smpl, self._byref(arr))

    def pick(self, logits: np.ndarray) -> int:
        import llama_cpp

        tok = int(np.argmax(logits))
        self._one[0].id, self._one[0].logit, self._one[0].p = tok, float(logits[tok]), 0.0
        self._apply(self._one, 1)
        if self._one[0].logit == float("-inf"):  # rejected: mask everything, argmax again
            self.full_masks += 1
            self._all_np["logit"] = logits
            self._all_np["p"] = 0.0
            self._apply(self._all, self.n_vocab)
            tok = int(np.argmax(self._all_np["logit"]))
        llama_cpp.llama_sampler_accept(self.smpl, tok)
        return tok

    def close(self) -> None:
        import llama_cpp

        if self.smpl:
            llama_cpp.llama_sampler_free(self.smpl)
            self.smpl = None


def decode_until_eog(llm, max_tokens: int,
                     picker: GrammarGreedy | None = None) -> tuple[list[int], str, float | None]:
    """Argmax tokens after what ``llm`` (a ``llama_cpp.Llama``) has evaluated, checked by
    ``picker`` when given, until an end-of-generation token (not kept) or ``max_tokens``:
    (tokens, "stop" or "length", ``perf_counter`` time of the first pick)."""
    import time

    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    out: list[int] = []
    first = None
    while len(out) < max_tokens:
        logits = last_logits(llm, n_vocab)
        tok = picker.pick(logits) if picker is not None else int(np.argmax(logits))
        if first is None:
            first = time.perf_counter()
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            return out, "stop", first
        out.append(tok)
        llm.eval([tok])
    return out, "length", first


class LlamaCppRunner:
    def __init__(self, gguf: str | os.PathLike, *, n_ctx: int, threads: int | None = None,
                 all_logits: bool = False, use_mmap: bool = True, max_seqs: int = 1):
        from llama_cpp import Llama

        self.path = Path(gguf)
        threads = threads or len(os.sched_getaffinity(0))
        self.llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, logits_all=all_logits, use_mmap=use_mmap,
                         verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.n_ctx = n_ctx
        self.all_logits = all_logits
        self.batch: BatchDecoder | None = None
        if max_seqs > 1:
            try:
                self.batch = BatchDecoder(self.llm, max_seqs, n_ctx)
            except BaseException:
                self.llm.close()
                raise

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()
            self.batch = None
        self.llm.close()

    def _check_len(self, n: int) -> None:
        if n > self.n_ctx:
            raise ValueError(f"{n} positions do not fit n_ctx={self.n_ctx}")

    def last_logits(self) -> np.ndarray:
        return last_logits(self.llm, self.n_vocab)

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

    def greedy_constrained(self, prompt: Sequence[int], max_tokens: int, grammar: str) -> list[int]:
        """Argmax decoding under a GBNF ``grammar``, checked the way llama.cpp's own sampler
        checks it (:class:`GrammarGreedy`)."""
        self._check_len(len(prompt) + max_tokens)
        picker = GrammarGreedy(self.llm.model, grammar)
        try:
            self.llm.reset()
            self.llm.eval(list(prompt))
            out: list[int] = []
            while True:
                out.append(picker.pick(self.last_logits()))
                if len(out) >= max_tokens:
                    return out
                self.llm.eval([out[-1]])
        finally:
            picker.close()

    def greedy_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        """Argmax decoding of several prompts together, ``max_tokens`` each (no EOS stop)."""
        if self.batch is None:
            raise RuntimeError("construct the runner with max_seqs > 1 to decode several sequences")
        return self.batch.greedy(prompts, max_tokens)

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


def max_parallel_sequences() -> int:
    """llama.cpp's compile-time limit on sequence ids in one context."""
    import llama_cpp

    return int(llama_cpp.llama_max_parallel_sequences())


class BatchDecoder:
    """``max_seqs`` sequences of up to ``seq_ctx`` positions each, decoded together.

    The context copies the ``Llama`` object's parameters (threads, attention and KV
    types), so one sequence here runs as it does there; it differs in ``n_seq_max``
    and in a non-unified KV cache: each sequence gets its own ``seq_ctx`` cells and
    attends only to them, which suits distinct prompts with no shared prefix.
    """

    def __init__(self, llm, max_seqs: int, seq_ctx: int):
        import llama_cpp

        limit = max_parallel_sequences()
        if not 1 <= max_seqs <= limit:
            raise ValueError(f"{max_seqs} sequences at once: llama.cpp takes 1 to {limit} "
                             "(llama_max_parallel_sequences)")
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_seq_max = max_seqs
        params.n_ctx = max_seqs * seq_ctx
        # one decode step carries one token per sequence; prefill chunks are cut to n_batch
        params.n_batch = max(int(params.n_batch), max_seqs)
        params.n_ubatch = max(int(params.n_ubatch), max_seqs)
        params.kv_unified = False
        ctx = llama_cpp.llama_init_from_model(llm.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {max_seqs} sequences "
                               f"of {seq_ctx} positions")
        self.ctx = ctx
        self.n_vocab = llm.n_vocab()
        self.max_seqs = max_seqs
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self.seq_ctx = int(llama_cpp.llama_n_ctx_seq(ctx))
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)

    def describe(self) -> dict:
        return {"n_seq_max": self.max_seqs, "n_ctx": self.n_ctx, "n_ctx_seq": self.seq_ctx,
                "n_batch": self.n_batch, "kv_unified": False}

    def close(self) -> None:
        import llama_cpp

        if self.ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence id, wants logits) entries."""
        import llama_cpp

        b = self._batch
        b.n_tokens = len(entries)
        for i, (tok, pos, seq, out) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = out
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with {rc} on a batch of {len(entries)} tokens")

    def _row(self, i: int) -> np.ndarray:
        import llama_cpp

        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def greedy(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        import llama_cpp

        n = len(prompts)
        if not 1 <= n <= self.max_seqs:
            raise ValueError(f"{n} sequences: this context holds 1 to {self.max_seqs}")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        for s, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {s} is empty")
            if len(p) + max_tokens > self.seq_ctx:
                raise ValueError(f"prompt {s}: {len(p)} + {max_tokens} positions do not fit "
                                 f"n_ctx_seq={self.seq_ctx}")
        # metadata only, as Llama.reset does: stale cells are never attended
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), False)

        # Prefill every prompt, cut into n_batch-token llama_decode calls; the logits of
        # each prompt's last token give its first generated token.
        entries = [(int(t), pos, s, pos == len(p) - 1) for s, p in enumerate(prompts)
                   for pos, t in enumerate(p)]
        out: list[list[int]] = [[] for _ in range(n)]
        for i in range(0, len(entries), self.n_batch):
            chunk = entries[i:i + self.n_batch]
            self._decode(chunk)
            for j, (_, _, s, last) in enumerate(chunk):
                if last:
                    out[s].append(int(np.argmax(self._row(j))))

        # Decode: one token per sequence per llama_decode, rows in sequence order.
        for step in range(1, max_tokens):
            self._decode([(out[s][-1], len(prompts[s]) + step - 1, s, True) for s in range(n)])
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.ctx), shape=(n, self.n_vocab))
            for s, tok in enumerate(np.argmax(logits, axis=1)):
                out[s].append(int(tok))
        return out


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
