"""One KV cache group for a model that mixes sliding-window and full-attention layers.

vLLM 0.32's hybrid KV cache manager gives such a model (Gemma 3: five sliding-window layers to
each global one; Gemma 2: every other layer) one KV cache group per run of same-kind layers,
so that a sliding-window layer keeps only its window. Each group builds its own attention
metadata every step (block table, slot mapping, the CPU backend's scheduler metadata): the
Gemma 3 270M file decodes with six groups, and the runner's input preparation is the largest
piece of its step outside the forward and the head.

The manager's gain is memory, and the edge engines do not take it: they price the KV budget
flat, every layer holding the full context (:mod:`vllm_edge.runtime.kv`), which is exactly
what one group needs. With vLLM's ``disable_hybrid_kv_cache_manager`` every layer is in one
group and the metadata is built once a step. The window is still applied: vLLM's CPU backend
reads it from each layer, not from the group, and builds the shared metadata without one when
the group's layers disagree (its ``_group_sliding_window``). Checked against transformers in
float32 on the Gemma 3 file, past the window, with and without the switch
(tests/runtime/test_kv_groups_engine.py).

A budget the caller gave (``kv_cache_memory_bytes``) keeps vLLM's choice: the hybrid manager may
fit more sequences in it than one group does.
"""

from __future__ import annotations

from typing import Any

from vllm_edge.runtime.kv import KvBudget

ENV_SWITCH = "VLLM_EDGE_ONE_KV_GROUP"
VLLM_ARG = "disable_hybrid_kv_cache_manager"


def mixes_windows(budget: KvBudget) -> bool:
    """Whether the model has both sliding-window and full-attention layers (several groups
    under vLLM's hybrid manager)."""
    return bool(budget.sliding_window) and 0 < budget.sliding_layers < budget.num_layers


def apply(kwargs: dict[str, Any], reasons: dict[str, str], budget: KvBudget, priced: bool) -> None:
    """Set ``disable_hybrid_kv_cache_manager`` in ``kwargs`` where one group costs nothing,
    with the reason. ``priced``: the budget is the flat one the edge engine priced."""
    from vllm_edge import envs

    if not mixes_windows(budget):
        return
    mix = (f"{budget.sliding_layers} of {budget.num_layers} layers have a "
           f"{budget.sliding_window}-token window")
    if not envs.get(ENV_SWITCH):
        reasons[VLLM_ARG] = (f"vLLM's hybrid manager ({ENV_SWITCH}=0): {mix}, one KV cache group "
                             "per kind of layer, each building its attention metadata every step")
        return
    if not priced:
        reasons[VLLM_ARG] = (f"vLLM's hybrid manager: {mix}, and the KV budget was given, which "
                             "it may stretch to more sequences than one group fits")
        return
    kwargs[VLLM_ARG] = True
    reasons[VLLM_ARG] = (
        f"one KV cache group: {mix}; the budget is priced with every layer at full length, "
        "which one group needs, so the hybrid manager's saving is not taken while each of its "
        "groups would build attention metadata every step; the CPU attention still applies each "
        f"layer's window ({ENV_SWITCH}=0 restores the hybrid manager)")
