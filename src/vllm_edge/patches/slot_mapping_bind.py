"""The slot-mapping launch binds its arguments without ``inspect`` (docs/design/patches.md).

Every step, vLLM 0.32.0's model runner computes the KV slot mapping through
``ComputeSlotMappingKernel.__call__`` (``v1/worker/block_table.py``), which its
``kernel_launcher`` decorator (``model_executor/warmup/jit_warmup.py``) wraps: the wrapper
runs ``inspect.Signature.bind`` and ``apply_defaults`` on the call to name the launch inputs.
The runner passes all twelve arguments positionally, so the binding is the parameter names
zipped with the arguments: the patch builds that dictionary directly and hands it to the same
``launch``. Calls with keywords or another argument count, or a kernel that does not bind its
inputs, go through the original wrapper.

``fast_calls`` counts the launches bound without ``inspect`` in this process.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from vllm_edge.patches import Patch

fast_calls = 0


def _is_fixed_upstream(owner: Any, attr: str, current: Any) -> bool:
    # the wrapper's own code: inspect.getsource would unwrap it to the launch specification
    code = getattr(current, "__code__", None)
    return code is not None and "bind" not in code.co_names


def _make_replacement(owner: Any, attr: str, original: Any) -> Any:
    call_fn = getattr(original, "__wrapped__", None)
    if call_fn is None:
        raise LookupError(f"{owner.__name__}.{attr} binds per call but does not expose the "
                          "launch specification it wraps (__wrapped__)")
    params = list(inspect.signature(call_fn).parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        raise LookupError(f"{owner.__name__}.{attr} has parameters that a positional zip "
                          "cannot bind")
    names = tuple(p.name for p in params[1:])  # without self

    @functools.wraps(call_fn)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        global fast_calls
        if kwargs or len(args) != len(names) or not self.bind_launch_inputs:
            return original(self, *args, **kwargs)
        launch_spec = call_fn(self, *args)
        fast_calls += 1
        return self.launch(launch_spec, dict(zip(names, args)))

    __call__.__vllm_edge_patch__ = "slot_mapping_bind"
    return __call__


PATCH = Patch(
    name="slot_mapping_bind",
    target="vllm.v1.worker.block_table:ComputeSlotMappingKernel.__call__",
    reason=(
        "the slot-mapping launch runs inspect.Signature.bind and apply_defaults on its twelve "
        "arguments at every step"
    ),
    fixed_when="the code of ComputeSlotMappingKernel.__call__ no longer calls bind",
    env_switch="VLLM_EDGE_PATCH_SLOT_MAPPING_BIND",
    is_fixed_upstream=_is_fixed_upstream,
    make_replacement=_make_replacement,
)
