"""The auto gate's bookkeeping on token streams (no engine: the engine tests are in
test_speculative_engine.py), and its hold on vLLM's runner method."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import speculative_gate
from vllm_edge.runtime.speculative_gate import Gate


class Stream:
    """One request's sequence as the runner's buffers hold it."""

    def __init__(self, tokens):
        self.tokens = list(tokens)

    def step(self, gate, rid, draft, produced):
        """The runner's proposal for this request (after its new tokens); then the tokens the
        next step produces."""
        out = gate.filter([rid], [self.tokens], [len(self.tokens)], [draft])[0]
        self.tokens += produced
        return out


def test_a_kept_proposal_keeps_the_next_one_coming():
    gate, s = Gate(), Stream(range(10))
    assert s.step(gate, "a", [1, 2, 3, 4], [1, 2, 3, 4, 5]) == [1, 2, 3, 4]
    # a proposal is scored at the next call, from the tokens produced since: 1.0 -> 1.75 (4 kept)
    assert s.step(gate, "a", [6, 7, 8, 9], [6, 70]) == [6, 7, 8, 9]
    assert gate.requests["a"].mean == pytest.approx(1.75)
    assert s.step(gate, "a", [], [1]) == []  # 1 kept of [6, 7, 8, 9]
    assert gate.requests["a"].mean == pytest.approx(0.75 * 1.75 + 0.25)


def test_rejected_proposals_are_held_back_then_scored_from_the_tokens_that_follow():
    gate, s = Gate(), Stream(range(10))
    submitted, withheld = speculative_gate.submitted, speculative_gate.withheld
    # three proposals whose first token the model does not produce: 1.0 -> .75 -> .5625
    assert s.step(gate, "a", [50, 51], [7]) == [50, 51]
    assert s.step(gate, "a", [50, 51], [8]) == [50, 51]
    assert s.step(gate, "a", [50, 51], [9]) == [50, 51]
    assert speculative_gate.submitted - submitted == 3
    # the third is scored now (.421875, under the bar): this proposal is held back, and the
    # answer turns to copying, one token per plain step
    assert s.step(gate, "a", [20, 21, 22], [20]) == []
    assert gate.requests["a"].mean == pytest.approx(0.421875)
    assert gate.requests["a"].pending == (13, [20, 21, 22])
    assert s.step(gate, "a", [21, 22, 23], [21]) == []  # [20] produced: not decided yet
    assert s.step(gate, "a", [22, 23, 24], [22]) == []
    assert gate.requests["a"].pending == (13, [20, 21, 22])
    assert speculative_gate.withheld - withheld == 3
    # all three produced: scored 3, the mean is back over the bar, this proposal goes out
    assert s.step(gate, "a", [23, 24, 25], [23, 24, 25, 26]) == [23, 24, 25]
    assert gate.requests["a"].mean == pytest.approx(0.75 * 0.421875 + 0.75)
    assert gate.requests["a"].pending == (16, [23, 24, 25])


def test_a_request_without_a_proposal_passes_and_one_that_left_is_forgotten():
    gate = Gate()
    tokens = [list(range(5)), list(range(7))]
    assert gate.filter(["a", "b"], tokens, [5, 7], [[], [3, 4]]) == [[], [3, 4]]
    assert set(gate.requests) == {"a", "b"}
    assert gate.filter(["b"], tokens[1:], [7], [[]]) == [[]]
    assert set(gate.requests) == {"b"}


def test_each_request_has_its_own_mean():
    gate = Gate()
    gate.requests["slow"] = speculative_gate._Request(mean=0.1)
    out = gate.filter(["slow", "new"], [[0] * 4, [0] * 4], [4, 4], [[1, 2], [1, 2]])
    assert out == [[], [1, 2]]


def test_the_gate_holds_vllms_runner_method():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert speculative_gate.apply() == "applied"
    assert speculative_gate.apply() == "applied"  # once per process
    method = CPUModelRunner.propose_draft_token_ids  # the CPU runner inherits the wrapped one
    assert method is GPUModelRunner.propose_draft_token_ids and method.__vllm_edge_gate__
    assert not hasattr(method.__wrapped__, "__vllm_edge_gate__")


def test_a_changed_runner_signature_is_refused():
    def propose_draft_token_ids(self, sampled_token_ids, scheduler_output):
        return []

    with pytest.raises(LookupError, match="the gate expects"):
        speculative_gate._wrap(propose_draft_token_ids)


def test_other_runners_get_vllms_proposals_untouched():
    class Runner:
        speculative_config = None
        input_batch = None

    wrapped = speculative_gate._wrap(lambda self, scheduler_output, sampled_token_ids: [[1, 2]])
    assert wrapped(Runner(), None, [[0]]) == [[1, 2]]
    assert "_vllm_edge_gate" not in Runner().__dict__
