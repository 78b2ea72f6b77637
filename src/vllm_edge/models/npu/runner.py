"""Drive the fixed-shape graphs the way a phone app does: one KV cache of ``context`` slots
on the host, a prefill graph for the prompt in chunks, then the decode graph token by token.

A graph is any callable taking the input dict (numpy arrays, names from
:func:`vllm_edge.models.npu.llama.io_names`) and returning the outputs in order, so the torch
module, an onnxruntime CPU session and a QNN session all run through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from vllm_edge.models.npu.errors import NpuExportError
from vllm_edge.models.npu.llama import MASK_VALUE
from vllm_edge.models.npu.sink import Sink

Graph = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class CacheShape:
    n_layer: int
    n_kv: int
    head_dim: int
    context: int


def inputs(cache: list[np.ndarray], n_past: int, tokens: Sequence[int], chunk: int,
           shape: CacheShape) -> dict[str, np.ndarray]:
    """The inputs of one call: ``tokens`` (at most ``chunk``, padded) at positions
    ``n_past ..``, the first ``n_past`` cache slots valid."""
    c = shape.context
    past = c - chunk
    if len(tokens) > chunk or n_past + chunk > c or n_past > past:
        raise NpuExportError(f"{n_past} cached + a chunk of {chunk} does not fit a context of {c}")
    # a short chunk is padded with its last token: the padding's outputs are dropped, but its
    # activations share each tensor's 16-bit scale, and token 0 (<|endoftext|> in SmolLM2)
    # raises the residual's massive activation as a first token does
    ids = np.full((1, chunk), tokens[-1] if len(tokens) else 0, np.int32)
    ids[0, :len(tokens)] = tokens
    pos = np.minimum(np.arange(n_past, n_past + chunk, dtype=np.int32), c - 1)[None]
    mask = np.full((1, 1, chunk, c), MASK_VALUE, np.float32)
    mask[0, 0, :, :n_past] = 0.0
    for t in range(chunk):
        mask[0, 0, t, past:past + t + 1] = 0.0
    feed = {"input_ids": ids, "position_ids": pos, "attention_mask": mask}
    for i in range(shape.n_layer):
        feed[f"past_key.{i}"] = cache[2 * i][:, :, :past]
        feed[f"past_value.{i}"] = cache[2 * i + 1][:, :, :past]
    return feed


def empty_cache(shape: CacheShape) -> list[np.ndarray]:
    return [np.zeros((1, shape.n_kv, shape.context, shape.head_dim), np.float32)
            for _ in range(2 * shape.n_layer)]


def run(tokens: Sequence[int], shape: CacheShape, prefill: Graph, prefill_chunk: int,
        decode: Graph | None = None, n_prefill: int | None = None,
        record: Callable[[dict[str, np.ndarray]], None] | None = None,
        sink: Sink | None = None) -> np.ndarray:
    """Teacher-forced logits: the first ``n_prefill`` tokens (default all) through the prefill
    graph in chunks, the rest through the decode graph one at a time. ``record`` sees every
    input dict (for calibration).

    Without ``sink``: [len(tokens), vocab]. With it, ``tokens`` must start with the sink token,
    whose cache entries fill slot 0 and which no graph runs: [len(tokens) - 1, vocab], the
    logits after each later token."""
    n_prefill = len(tokens) if n_prefill is None else n_prefill
    if len(tokens) > shape.context - 1:
        raise NpuExportError(f"{len(tokens)} tokens do not fit a context of {shape.context}")
    cache = empty_cache(shape)
    out: list[np.ndarray] = []
    n = 0
    if sink is not None:
        if not tokens or tokens[0] != sink.token:
            raise NpuExportError(f"this export's sequences start with its sink token {sink.token}; "
                                 f"this one starts with {tokens[0] if tokens else 'nothing'}")
        if len(tokens) < 2:
            raise NpuExportError("nothing to run after the sink token")
        for j, entry in enumerate(sink.kv):
            cache[j][:, :, :1] = entry
        n = 1

    def step(graph: Graph, chunk: int, part: Sequence[int]) -> None:
        nonlocal n
        feed = inputs(cache, n, part, chunk, shape)
        if record is not None:
            record(feed)
        res = graph(feed)
        out.append(np.asarray(res[0])[0, :len(part)])
        for j, present in enumerate(res[1:]):
            cache[j][:, :, n:n + len(part)] = np.asarray(present)[:, :, :len(part)]
        n += len(part)

    while n < n_prefill:
        # chunks end on multiples of the chunk length, so after the sink's slot the first one
        # is a token short and the last one still fits the context
        step(prefill, prefill_chunk, tokens[n:min((n // prefill_chunk + 1) * prefill_chunk, n_prefill)])
    while n < len(tokens):
        if decode is None:
            raise NpuExportError("tokens past the prefill need a decode graph")
        step(decode, 1, tokens[n:n + 1])
    return np.concatenate(out, axis=0)


def torch_graph(model) -> Graph:
    """The torch module as a graph callable."""
    import torch

    from vllm_edge.models.npu.llama import io_names

    names = io_names(model.shape.n_layer)[0]

    def call(feed: dict[str, np.ndarray]):
        with torch.no_grad():
            return [t.numpy() for t in model(*(torch.from_numpy(np.ascontiguousarray(feed[k]))
                                                for k in names))]
    return call


def ort_graph(session) -> Graph:
    """An onnxruntime session as a graph callable."""
    names = [i.name for i in session.get_inputs()]
    return lambda feed: session.run(None, {k: feed[k] for k in names})
