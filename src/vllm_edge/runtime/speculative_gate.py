"""``--speculative auto``'s per-request gate on vLLM's n-gram proposals.

vLLM 0.32's n-gram proposer offers a proposal whenever the last few tokens occurred before,
and the next step verifies it whatever became of the request's earlier proposals. In prose
a three-token match recurs by chance, and each rejected proposal makes a step several rows
wide for one token. The gate keeps, per request, a running mean of how many tokens of its
recent proposals the model went on to produce, and passes a proposal to vLLM only while that
mean is at least :data:`THRESHOLD`.

The mean also learns from the proposals it holds back: a withheld proposal is compared with
the tokens the request then produces one step at a time, so a request whose text turns to
copying (a quotation, a repeated list) gets its proposals back without a verification step
paying for the test. Under greedy decoding that comparison is exact: the model's next tokens
are the ones verification would have kept.

The batch-size half of ``auto`` is vLLM's own schedule
(``num_speculative_tokens_per_batch_size``, see :mod:`vllm_edge.runtime.speculative`). The
gate wraps ``GPUModelRunner.propose_draft_token_ids`` (the CPU runner inherits it) and acts
only on a runner whose speculative config is n-gram with such a schedule, which is what
``auto`` sends; every other runner gets vLLM's proposals untouched.
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids"
_PARAMS = ("self", "scheduler_output", "sampled_token_ids")

# Tokens kept per proposal, running mean, below which a request's proposals are held back.
# A verification step at batch 1 reads the weights once, as a plain step does, so its extra
# cost is the wider rows; half a token is meant as a margin over that, low enough to keep
# copying answers and high enough to catch prose, where a chance match keeps about nothing.
# Not tuned by a speed measurement yet.
THRESHOLD = 0.5
# Weight of the newest proposal in the mean: about the last four decide.
WEIGHT = 0.25
# A new request starts as if its proposals were kept, so a copying answer speculates from
# its first match; a chance match or two in prose brings it under the threshold.
START = 1.0

_lock = threading.Lock()
_state: str | None = None
# Proposals passed on / held back in this process (doctor and the tests read them).
submitted = 0
withheld = 0


@dataclass
class _Request:
    mean: float = START
    # The proposal being scored: the sequence length when it was made, and its tokens.
    pending: tuple[int, list[int]] | None = None

    def score(self, tokens: Any, length: int) -> None:
        """Settle the pending proposal once the tokens produced since decide it: on the first
        token that differs, or when as many tokens as it proposed have been produced."""
        if self.pending is None:
            return
        start, proposal = self.pending
        produced = [int(t) for t in tokens[start:min(length, start + len(proposal))]]
        kept = 0
        while kept < len(produced) and produced[kept] == proposal[kept]:
            kept += 1
        if kept < len(produced) or len(produced) == len(proposal):
            self.mean = (1 - WEIGHT) * self.mean + WEIGHT * kept
            self.pending = None


@dataclass
class Gate:
    """The per-request means of one model runner."""

    requests: dict[str, _Request] = field(default_factory=dict)

    def filter(self, req_ids: Sequence[str], token_ids: Any, lengths: Any,
               drafts: list[list[int]]) -> list[list[int]]:
        """``drafts`` (one list per request, in batch order) with the proposals of requests
        under the threshold replaced by ``[]``. ``token_ids[i][:lengths[i]]`` is request
        ``i``'s sequence so far, the one its proposal continues."""
        global submitted, withheld
        out: list[list[int]] = []
        live = set()
        for i, draft in enumerate(drafts):
            rid = req_ids[i]
            live.add(rid)
            req = self.requests.setdefault(rid, _Request())
            length = int(lengths[i])
            req.score(token_ids[i], length)
            if not draft:
                out.append(draft)
                continue
            if req.pending is None:
                req.pending = (length, [int(t) for t in draft])
            if req.mean >= THRESHOLD:
                submitted += 1
                out.append(draft)
            else:
                withheld += 1
                out.append([])
        for rid in [r for r in self.requests if r not in live]:
            del self.requests[rid]  # finished or preempted: a returning request starts afresh
        return out


def wants_gate(spec_config: Any) -> bool:
    """``auto``'s mark: n-gram proposals with a batch-size schedule."""
    return (spec_config is not None and getattr(spec_config, "method", None) == "ngram"
            and bool(getattr(spec_config, "num_speculative_tokens_per_batch_size", None)))


def _wrap(original: Any) -> Any:
    params = tuple(inspect.signature(original).parameters)[:len(_PARAMS)]
    if params != _PARAMS:
        raise LookupError(f"propose_draft_token_ids takes {params}, the gate expects {_PARAMS}")

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any,
                                *args: Any, **kwargs: Any) -> Any:
        drafts = original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        if not isinstance(drafts, list) or not wants_gate(getattr(self, "speculative_config", None)):
            return drafts
        gate = self.__dict__.get("_vllm_edge_gate")
        if gate is None:
            gate = self._vllm_edge_gate = Gate()
        batch = self.input_batch
        return gate.filter(batch.req_ids, batch.token_ids_cpu, batch.num_tokens_no_spec, drafts)

    propose_draft_token_ids.__vllm_edge_gate__ = True
    return propose_draft_token_ids


def apply() -> str:
    """Install the gate once per process; its state: ``applied`` or ``target-missing: why``."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        try:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner

            current = GPUModelRunner.propose_draft_token_ids
            if not getattr(current, "__vllm_edge_gate__", False):
                GPUModelRunner.propose_draft_token_ids = _wrap(current)
            _state = "applied"
        except (ImportError, AttributeError, LookupError) as exc:
            _state = f"target-missing: {exc}"
        return _state


def report() -> dict[str, Any]:
    return {"state": _state, "submitted": submitted, "withheld": withheld}
