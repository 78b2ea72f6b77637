"""pp_stage_buffer without an engine: the pinned vLLM has the bug, the replacement allocates
the stage buffer the way _dummy_run does and then runs vLLM's own method, and a fixed
upstream is recognised. The engine run is tests/runtime/test_parallel_engine.py (PP=2)."""

from __future__ import annotations

import pytest
import torch

from vllm_edge.patches import pp_stage_buffer as pp


def _original():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    current = GPUModelRunner.sync_and_gather_intermediate_tensors
    return getattr(current, "__wrapped__", current)


def test_the_pinned_vllm_asserts_on_a_stage_without_its_buffer():
    with pytest.raises(AssertionError):
        _original()(pp._stage(), 2, None, False)
    assert not pp._is_fixed_upstream(None, "sync_and_gather_intermediate_tensors", _original())


def test_the_replacement_allocates_once_and_copies_the_incoming_states():
    from vllm.sequence import IntermediateTensors

    fixed = pp._make_replacement(None, "sync_and_gather_intermediate_tensors", _original())
    stage = pp._stage()
    incoming = IntermediateTensors({"hidden_states": torch.arange(6.0).view(3, 2)})
    out = fixed(stage, 3, incoming, True)
    buf = stage.intermediate_tensors["hidden_states"]
    assert buf.shape == (4, 2)  # max_num_tokens rows, as _dummy_run sizes it
    assert torch.equal(out["hidden_states"], incoming["hidden_states"])
    fixed(stage, 1, None, False)
    assert stage.intermediate_tensors["hidden_states"] is buf  # not allocated again


def test_an_upstream_that_allocates_is_recognised_as_fixed():
    def sync_and_gather_intermediate_tensors(self, num_tokens, intermediate_tensors, sync_self):
        return None

    assert pp._is_fixed_upstream(None, "sync_and_gather_intermediate_tensors",
                                 sync_and_gather_intermediate_tensors)
