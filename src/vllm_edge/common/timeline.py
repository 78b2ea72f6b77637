"""A startup timeline: named phases from process start to first token.

Off unless ``VLLM_EDGE_TIMELINE`` names a file; then each phase appends one JSON line to it
(name, start and end as epoch seconds, pid, this process's RssAnon at the end), so phases of
several processes land in one file. :func:`wrap` times a third-party callable in place:
the plugin wraps vLLM's and transformers' startup steps (:data:`TARGETS`) when the
timeline is on, and never otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import time
from typing import Any, Callable, Iterator

# (phase, "module:Class.method" or "module:function"). A phase can run inside another
# (weights inside model load); the report nests them by time.
TARGETS = (
    ("engine config", "vllm.engine.arg_utils:EngineArgs.create_engine_config"),
    ("hf config read", "transformers.configuration_utils:PretrainedConfig.get_config_dict"),
    ("tokenizer load", "transformers.tokenization_utils_base:PreTrainedTokenizerBase.from_pretrained"),
    ("engine core", "vllm.v1.engine.core:EngineCore.__init__"),
    ("device init", "vllm.v1.worker.cpu_worker:CPUWorker.init_device"),
    ("model load", "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model"),
    ("model init", "vllm.model_executor.model_loader.base_loader:initialize_model"),
    ("weights read", "vllm.model_executor.model_loader.default_loader:DefaultModelLoader.load_weights"),
    ("weights post-processing", "vllm.model_executor.model_loader.base_loader:process_weights_after_loading"),
    ("memory profile", "vllm.v1.worker.cpu_worker:CPUWorker.determine_available_memory"),
    ("compile warm-up run", "vllm.v1.worker.cpu_model_runner:CPUModelRunner.warming_up_model"),
    ("AOT artifact load", "vllm.compilation.decorators:_try_load_aot_compiled_fn"),
    # inside it, on a warm start: Inductor preprocesses its C++ prefix header to check its
    # precompiled-header cache, and probes the CPU's vector ISAs in subprocesses
    ("C++ header precompile", "torch._inductor.codecache:_precompile_header"),
    ("vector ISA probe", "torch._inductor.cpu_vec_isa:valid_vec_isa_list"),
    ("KV allocation", "vllm.v1.worker.cpu_worker:CPUWorker.initialize_from_config"),
    ("warm-up", "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model"),
    ("structured output init", "vllm.v1.structured_output:StructuredOutputManager.__init__"),
)
_WRAPPED = "__vllm_edge_timeline__"


def path() -> str | None:
    from vllm_edge import envs

    return envs.get("VLLM_EDGE_TIMELINE")


def record(name: str, start: float, end: float, file: str | None = None, **extra: Any) -> None:
    """Append one phase (one ``write`` of one line, so concurrent processes do not interleave)."""
    file = file or path()
    if not file:
        return
    from vllm_edge.common.procmem import rss_anon_kb

    line = json.dumps({"name": name, "start": start, "end": end, "pid": os.getpid(),
                       "rss_anon_kb": rss_anon_kb(os.getpid()), **extra}) + "\n"
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@contextlib.contextmanager
def phase(name: str, **extra: Any) -> Iterator[None]:
    file = path()
    start = time.time()
    try:
        yield
    finally:
        if file:
            record(name, start, time.time(), file, **extra)


def _timed(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            record(name, start, time.time())

    setattr(timed, _WRAPPED, fn)
    return timed


def wrap(name: str, target: str) -> bool:
    """Time every call of ``target`` ("module:Class.method" or "module:function") as phase
    ``name``. Idempotent; False when the target does not exist in this version."""
    mod_name, _, qual = target.partition(":")
    try:
        owner: Any = importlib.import_module(mod_name)
    except ImportError:
        return False
    *parents, attr = qual.split(".")
    for p in parents:
        owner = getattr(owner, p, None)
        if owner is None:
            return False
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    current = getattr(owner, attr, None)
    if current is None or hasattr(current, _WRAPPED) or \
            (raw is not None and hasattr(getattr(raw, "__func__", raw), _WRAPPED)):
        return current is not None
    if isinstance(raw, classmethod):
        setattr(owner, attr, classmethod(_timed(name, raw.__func__)))
    elif isinstance(raw, staticmethod):
        setattr(owner, attr, staticmethod(_timed(name, raw.__func__)))
    else:  # a function, or a method this class inherits
        setattr(owner, attr, _timed(name, current))
    return True


def install() -> list[str]:
    """Wrap :data:`TARGETS` when the timeline is on; the names of those not found."""
    if not path():
        return []
    return [t for name, t in TARGETS if not wrap(name, t)]


def read(file: str | os.PathLike) -> list[dict]:
    with open(file) as f:
        return [json.loads(line) for line in f if line.strip()]
