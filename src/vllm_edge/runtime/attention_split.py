"""vLLM's CPU attention key split, off in the edge engines where every thread keeps a KV head:
the same greedy tokens with and without speculation.

vLLM 0.32's CPU attention scheduler (``VLLM_CPU_ATTN_SPLIT_KV``, on by default) shares the keys
of a query tile that holds one token between the threads and merges the partial results.
Where the boundaries fall depends on the step's total key count and the thread count, and a
tile of several tokens is never split. A speculative verification step runs a sequence's last
token and its proposals as one tile of several rows; plain decoding runs the same position as
a lone row, split. The two round differently, so at a near tie of the two best logits the
greedy choice differs and the answers part from there. With the split off, the ``cpu_int4``
logprobs of the two are bit-identical.

The split buys parallelism for a lone sequence, and only once its attention is a visible share
of the step (long contexts): without it, the scheduler gives each KV head's attention to one
thread, so a model with fewer KV heads than threads leaves threads idle. The edge engines turn
the split off where every thread still gets a KV head of its own (the default model, 3 KV heads
on 2 threads), and keep vLLM's split where it would not (Gemma 3 270M, one KV head); there,
greedy answers with and without speculation can still part at a near tie. Both are measured,
per context length, in ``benchmarks/results/grid/attention_split/``. A value the user set is
kept.

Torch-free: the engine arguments are decided before vLLM is imported.
"""

from __future__ import annotations

ENV = "VLLM_CPU_ATTN_SPLIT_KV"
SAME = ("greedy answers are the same with and without speculation (vLLM splits a lone query "
        "token's keys between the threads, never a tile of several tokens)")


def apply(env: dict[str, str], reasons: dict[str, str], kv_heads: int, threads: int) -> None:
    """Decide the split for an engine whose ranks attend over ``kv_heads`` KV heads on
    ``threads`` threads each: into ``env`` and ``reasons``, in place."""
    from vllm_edge import envs

    given = envs.get(ENV)
    if given is not None:
        reasons[ENV] = (f"{ENV}={int(given)} given in the environment"
                        + (": greedy answers with and without speculation can part at a near tie"
                           if given else f": {SAME}"))
        return
    if kv_heads >= threads:
        env[ENV] = "0"
        reasons[ENV] = (f"0: each of the {threads} threads has a KV head of its own to attend "
                        f"over ({kv_heads} KV heads) without the split, and {SAME}")
        return
    reasons[ENV] = (f"vLLM's default (on): {kv_heads} KV head(s) for {threads} threads, so without "
                    "the split a lone sequence's attention would leave threads idle; greedy "
                    f"answers with and without speculation can part at a near tie ({ENV}=0: the "
                    "same answers)")
