"""A later pipeline stage allocates its input buffer on first use.

In vLLM 0.32.0 a pipeline stage after the first receives the previous stage's hidden states
into ``GPUModelRunner.intermediate_tensors``, a buffer allocated only by ``_dummy_run``
(the profiling and warm-up forward). The CPU worker skips that forward when the model runs
eagerly with an explicit KV budget (``CPUWorker._should_warm_up_model``), which is exactly
the edge mode's eager setup, so the stage's first real step fails on
``assert self.intermediate_tensors is not None`` in ``sync_and_gather_intermediate_tensors``.

The replacement allocates the buffer there, with the size and dtype ``_dummy_run`` uses,
when it is still missing, then runs the original.
"""

from __future__ import annotations

import types
from typing import Any

from vllm_edge.patches import Patch


class _Model:
    def make_empty_intermediate_tensors(self, batch_size: int, dtype: Any, device: Any) -> Any:
        import torch
        from vllm.sequence import IntermediateTensors

        return IntermediateTensors({"hidden_states": torch.zeros(batch_size, 2, dtype=dtype, device=device)})


def _stage(intermediate: Any = None) -> Any:
    import torch

    return types.SimpleNamespace(intermediate_tensors=intermediate, model=_Model(), max_num_tokens=4,
                                 model_config=types.SimpleNamespace(dtype=torch.float32), device="cpu")


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    try:  # a stage that never ran _dummy_run asks for its buffer
        current(_stage(), 2, None, False)
    except AssertionError:
        return False
    return True


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    def sync_and_gather_intermediate_tensors(self: Any, num_tokens: int, intermediate_tensors: Any,
                                             sync_self: bool) -> Any:
        if self.intermediate_tensors is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return original(self, num_tokens, intermediate_tensors, sync_self)

    sync_and_gather_intermediate_tensors.__vllm_edge_patch__ = "pp_stage_buffer"
    sync_and_gather_intermediate_tensors.__wrapped__ = original
    return sync_and_gather_intermediate_tensors


PATCH = Patch(
    name="pp_stage_buffer",
    target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.sync_and_gather_intermediate_tensors",
    reason=(
        "a pipeline stage after the first allocates its input buffer only in the warm-up "
        "forward, which the CPU worker skips when eager with an explicit KV budget: its first "
        "step fails an assertion"
    ),
    fixed_when="the method, called on a stage that never ran the warm-up, no longer asserts",
    env_switch="VLLM_EDGE_PATCH_PP_STAGE_BUFFER",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
