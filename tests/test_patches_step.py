"""The per-step patches, greedy_sampler and slot_mapping_bind, without an engine: the live
vLLM attribute is ours, it takes its short route exactly when that is allowed, and it returns
what the original returns."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from vllm_edge import patches
from vllm_edge.patches import greedy_sampler, slot_mapping_bind

VOCAB = 1000


@pytest.fixture(scope="module", autouse=True)
def _loaded(greedy_sampler_on):
    # the greedy patch is off by default; these tests are its own, so they switch it on
    patches.load_all()


# --- greedy_sampler ----------------------------------------------------------------------

def _processors():
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    cpu = torch.device("cpu")
    # the built-ins vLLM gives every batch; each has nothing to do until a request asks
    return LogitsProcessors([MinPLogitsProcessor(_Config(), cpu, False),
                             LogitBiasLogitsProcessor(None, cpu, False),
                             MinTokensLogitsProcessor(None, cpu, False)])


class _Config:
    class scheduler_config:
        max_num_seqs = 4


def _metadata(batch: int, **over):
    from vllm.v1.sample.metadata import SamplingMetadata

    zeros = torch.zeros(batch)
    fields = {
        "temperature": None, "all_greedy": True, "all_random": False, "top_p": None, "top_k": None,
        "generators": {}, "max_num_logprobs": None, "no_penalties": True, "prompt_token_ids": None,
        "frequency_penalties": zeros, "presence_penalties": zeros, "repetition_penalties": zeros + 1,
        "output_token_ids": [[] for _ in range(batch)], "allowed_token_ids_mask": None,
        "bad_words_token_ids": {}, "logitsprocs": _processors(),
    }
    return SamplingMetadata(**{**fields, **over})


def _logits(batch: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    # few distinct values, so most rows hold ties for the maximum
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, (batch, VOCAB), generator=g).to(dtype)


def _run(forward, logits, md, **kw):
    from vllm.v1.sample.sampler import Sampler

    before = (greedy_sampler.fast_steps, greedy_sampler.fallback_steps)
    out = forward(Sampler(), logits.clone(), md, **kw)
    return out, (greedy_sampler.fast_steps - before[0], greedy_sampler.fallback_steps - before[1])


def _same(a, b) -> None:
    assert a.sampled_token_ids.dtype == b.sampled_token_ids.dtype == torch.int32
    assert a.sampled_token_ids.shape == b.sampled_token_ids.shape
    assert torch.equal(a.sampled_token_ids, b.sampled_token_ids)
    assert (a.logprobs_tensors is None) == (b.logprobs_tensors is None)
    if a.logprobs_tensors is not None:
        for x, y in zip(a.logprobs_tensors, b.logprobs_tensors):
            assert (x is None and y is None) or torch.equal(x, y)


def test_the_live_sampler_runs_the_fast_path():
    from vllm.v1.sample.sampler import Sampler

    assert getattr(Sampler.forward, "__vllm_edge_patch__", None) == "greedy_sampler"
    logits, md = _logits(1, torch.bfloat16), _metadata(1)
    before = greedy_sampler.fast_steps
    out = Sampler()(logits=logits, sampling_metadata=md)  # as the model runner calls it
    assert greedy_sampler.fast_steps == before + 1
    assert out.sampled_token_ids.tolist() == [[int(logits.float().argmax())]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_batches_take_the_fast_path_with_the_original_tokens(dtype, batch):
    from vllm.v1.sample.sampler import Sampler

    for seed in range(20):
        logits = _logits(batch, dtype, seed)
        if seed == 1:
            logits[0, 5] = float("nan")  # NaN is the maximum for both
        if seed == 2:
            logits[-1] = float("-inf")  # a row with no finite logit
        ours, (fast, slow) = _run(Sampler.forward, logits, _metadata(batch))
        theirs, _ = _run(greedy_sampler.PATCH.original, logits, _metadata(batch))
        assert (fast, slow) == (1, 0)
        _same(ours, theirs)
    assert ours.logprobs_tensors is None


def _with_bias(md):
    proc = md.logitsprocs.non_argmax_invariant[0]
    proc.biases = {0: {7: 100.0}}
    proc.bias_tensor = torch.tensor([100.0])
    proc.logits_slice = (torch.tensor([0]), torch.tensor([7]))
    return md


def _with_min_tokens(md, logits):
    proc = md.logitsprocs.non_argmax_invariant[1]
    top = int(logits[0].float().argmax())  # the "stop token" is the greedy pick: it must change
    proc.min_toks = {0: (5, [], {top}, False)}
    proc.logits_slice = (torch.tensor([0]), torch.tensor([top]))
    return md


class _Budget:
    """A thinking-budget holder tracking one request; forbids token 3."""

    def has_tracked_requests(self):
        return True

    def update_state(self, *a, **k):
        pass

    def apply_to_logits(self, logits, *a):
        logits[:, 3] = float("-inf")
        return logits


class _CustomProc:
    def is_argmax_invariant(self):
        return False

    def apply(self, logits):
        logits[:, 11] = 1e9
        return logits


def _fallback_cases(batch, logits):
    mask = torch.zeros(batch, VOCAB, dtype=torch.bool)
    mask[:, int(logits[0].float().argmax())] = True
    procs = _processors()
    procs.non_argmax_invariant.append(_CustomProc())
    gen = torch.Generator().manual_seed(1)
    return {
        "not all greedy": _metadata(batch, all_greedy=False, temperature=torch.full((batch,), 0.7),
                                    generators={0: gen}),
        "logprobs": _metadata(batch, max_num_logprobs=2),
        "sampled-token logprobs": _metadata(batch, max_num_logprobs=0),
        "logprob token ids": _metadata(batch, logprob_token_ids={0: [1, 2]}),
        "penalties": _metadata(batch, no_penalties=False, repetition_penalties=torch.full((batch,), 1.3),
                               prompt_token_ids=torch.zeros(batch, 2, dtype=torch.int64),
                               output_token_ids=[[int(logits[i].float().argmax())] for i in range(batch)]),
        "bad words": _metadata(batch, bad_words_token_ids={0: [[int(logits[0].float().argmax())]]}),
        "allowed-token mask": _metadata(batch, allowed_token_ids_mask=mask),
        "logit bias": _with_bias(_metadata(batch)),
        "min_tokens": _with_min_tokens(_metadata(batch), logits),
        "thinking budget": _metadata(batch, thinking_budget_state_holder=_Budget()),
        "custom processor": _metadata(batch, logitsprocs=procs),
    }


FALLBACK_CASES = ["not all greedy", "logprobs", "sampled-token logprobs", "logprob token ids",
                  "penalties", "bad words", "allowed-token mask", "logit bias", "min_tokens",
                  "thinking budget", "custom processor"]


def test_the_fallback_cases_are_the_listed_ones():
    assert list(_fallback_cases(2, _logits(2, torch.bfloat16))) == FALLBACK_CASES


@pytest.mark.parametrize("case", FALLBACK_CASES)
def test_anything_that_can_change_the_token_runs_the_original(case):
    from vllm.v1.sample.sampler import Sampler

    logits = _logits(2, torch.bfloat16, seed=3)
    ours, (fast, slow) = _run(Sampler.forward, logits, _fallback_cases(2, logits)[case])
    torch.manual_seed(0)
    theirs, _ = _run(greedy_sampler.PATCH.original, logits, _fallback_cases(2, logits)[case])
    assert (fast, slow) == (0, 1), case
    if case != "not all greedy":  # random rows draw from their generator
        _same(ours, theirs)


def test_speculative_bonus_token_runs_the_original():
    from vllm.v1.sample.sampler import Sampler

    _, (fast, slow) = _run(Sampler.forward, _logits(1, torch.bfloat16), _metadata(1),
                           predict_bonus_token=True)
    assert (fast, slow) == (0, 1)


def test_a_processor_case_the_fast_path_skips_would_change_the_token():
    # The guard matters: the plain argmax differs from what vLLM returns with a logit bias.
    logits = _logits(2, torch.bfloat16, seed=3)
    theirs, _ = _run(greedy_sampler.PATCH.original, logits, _with_bias(_metadata(2)))
    assert theirs.sampled_token_ids[0, 0] == 7 != int(logits[0].float().argmax())


def test_greedy_detector_sees_the_upcast_in_the_pinned_vllm():
    from vllm.v1.sample.sampler import Sampler

    assert not greedy_sampler._is_fixed_upstream(Sampler, "forward", greedy_sampler.PATCH.original)

    def forward(self, logits, sampling_metadata):  # an upstream that samples in place
        return self.sample(logits, sampling_metadata)

    assert greedy_sampler._is_fixed_upstream(Sampler, "forward", forward)


def test_greedy_refuses_a_sampling_metadata_it_was_not_written_for(monkeypatch):
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    names = {f.name for f in dataclasses.fields(SamplingMetadata)}
    assert names == greedy_sampler._KNOWN_FIELDS  # every field of the pinned vLLM was read
    monkeypatch.setattr(greedy_sampler, "_KNOWN_FIELDS", greedy_sampler._KNOWN_FIELDS - {"logitsprocs"})
    with pytest.raises(LookupError, match="logitsprocs"):
        greedy_sampler._make_replacement(Sampler, "forward", greedy_sampler.PATCH.original)


# --- slot_mapping_bind -------------------------------------------------------------------

@pytest.fixture(scope="module")
def block_table():
    from vllm.platforms import current_platform
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.worker import block_table as bt

    if not isinstance(bt.ComputeSlotMappingKernel.kernel, KernelOverride):
        current_platform.register_triton_kernel_overrides()  # what the CPU worker does at init
    table = bt.BlockTable(16, 2, 8, 32, False, torch.device("cpu"), 1)
    table.append_row([3, 5], 0)
    table.append_row([7], 1)
    table.commit_block_table(2)
    return table


@pytest.fixture
def binds(monkeypatch):
    calls = []
    real = inspect.Signature.bind

    def bind(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(inspect.Signature, "bind", bind)
    return calls


def _slots(table) -> list[int]:
    table.slot_mapping.gpu.fill_(-7)
    # request 0 prefills positions 14..16 (crossing into its second block), request 1 decodes 2
    table.compute_slot_mapping(2, torch.tensor([0, 3, 4], dtype=torch.int32),
                               torch.tensor([14, 15, 16, 2], dtype=torch.int64))
    return table.slot_mapping.gpu[:5].tolist()


def test_the_live_slot_mapping_launch_binds_without_inspect(block_table, binds):
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    assert getattr(ComputeSlotMappingKernel.__call__, "__vllm_edge_patch__", None) == "slot_mapping_bind"
    before = slot_mapping_bind.fast_calls
    assert _slots(block_table) == [3 * 16 + 14, 3 * 16 + 15, 5 * 16 + 0, 7 * 16 + 2, -7]
    assert slot_mapping_bind.fast_calls == before + 1
    assert binds == []


def test_the_original_launch_binds_once_per_step_and_gives_the_same_slots(block_table, binds,
                                                                            monkeypatch):
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    ours = _slots(block_table)
    monkeypatch.setattr(ComputeSlotMappingKernel, "__call__", slot_mapping_bind.PATCH.original)
    assert _slots(block_table) == ours
    assert len(binds) == 1


def test_slot_mapping_launch_inputs_are_the_bound_arguments(block_table):
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    seen = []
    kernel = ComputeSlotMappingKernel()
    kernel.launch = lambda spec, inputs: seen.append((spec, inputs))
    t = block_table
    args = (2, 4, t.max_num_batched_tokens, torch.tensor([0, 3, 4], dtype=torch.int32),
            torch.tensor([14, 15, 16, 2]), t.block_table.gpu, t.block_table.gpu.stride(0),
            t.slot_mapping.gpu, 16, 1, 0, 1)
    kernel(*args)
    slot_mapping_bind.PATCH.original(kernel, *args)
    (spec_ours, ours), (spec_theirs, theirs) = seen
    assert spec_ours == spec_theirs
    assert list(ours) == list(theirs) and all(ours[k] is theirs[k] for k in ours)


def test_slot_mapping_keywords_go_through_the_original(block_table, binds):
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    kernel = ComputeSlotMappingKernel()
    kernel.launch = lambda spec, inputs: None
    names = list(inspect.signature(slot_mapping_bind.PATCH.original).parameters)[1:]
    before = slot_mapping_bind.fast_calls
    kernel(**dict(zip(names, (1, 1, 32, None, None, block_table.block_table.gpu, 8, None, 16, 1, 0, 1))))
    assert slot_mapping_bind.fast_calls == before and len(binds) == 1


def test_slot_mapping_detector_reads_the_wrapper_not_what_it_wraps():
    wrapper = slot_mapping_bind.PATCH.original
    assert not slot_mapping_bind._is_fixed_upstream(None, "__call__", wrapper)
    # the launch specification alone binds nothing: what an upstream without the wrapper has
    assert slot_mapping_bind._is_fixed_upstream(None, "__call__", wrapper.__wrapped__)


def test_the_greedy_fast_path_is_off_by_default():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_EDGE_PATCH_GREEDY_SAMPLER"}
    code = ("import json; from vllm_edge import patches\n"
            "print(json.dumps({p.name: p.state.value for p in patches.load_all()}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    states = json.loads(out.stdout.strip().splitlines()[-1])
    assert states["greedy_sampler"] == "disabled" and states["slot_mapping_bind"] == "applied"
