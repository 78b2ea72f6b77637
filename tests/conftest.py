"""Shared fixtures. Engine tests are marked slow and share one prepared model."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_MP = "VLLM_ENABLE_V1_MULTIPROCESSING"
GREEDY_SWITCH = "VLLM_EDGE_PATCH_GREEDY_SAMPLER"


@pytest.fixture(scope="module")
def greedy_sampler_on():
    """The greedy-sampler patch applied in this process for one module, then put back as the
    shipped default leaves it. The switch is off by default (it lost its speed A/B), so the suite
    runs without it; only the tests of the patch itself switch it on. A patch's state is settled
    once per process, so whichever test loaded the patches first decided it: re-apply here and
    undo on the way out, whatever the order."""
    from vllm_edge import patches
    from vllm_edge.patches import greedy_sampler

    patch = greedy_sampler.PATCH
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(GREEDY_SWITCH, "1")
        patches.load_all()
        if patch.state is not patches.State.APPLIED:
            patches._apply(patch)
        assert patch.state is patches.State.APPLIED, patch.detail
    yield patch
    from vllm_edge import envs

    if not envs.get(GREEDY_SWITCH):
        owner, attr, _ = patches.resolve(patch.target)
        setattr(owner, attr, patch.original)
        patches._apply(patch)  # back to the state the environment gives (disabled by default)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded default model, converted once (cached under VLLM_EDGE_HOME)."""
    from vllm_edge.models import store

    return store.prepare("default", progress=False)


@pytest.fixture(scope="session")
def default_int4_dir(default_model_dir) -> Path:
    """The default model's cpu_int4 build at the default group (DEFAULT_GROUP), quantized once
    (cached under VLLM_EDGE_HOME), so no test depends on another having prepared it."""
    from vllm_edge.models import store
    from vllm_edge.quant.groups import DEFAULT_GROUP

    return store.prepare_quantized("default", "cpu_int4", DEFAULT_GROUP, progress=False)


@pytest.fixture(scope="session")
def default_repacked_dir() -> Path:
    """The default model's GGUF repacked (its Q4_1 codes kept as cpu_int4 g32, the Q8_0
    embedding as cpu_int8 with the head tied to it), once (cached under VLLM_EDGE_HOME)."""
    from vllm_edge.models import store

    return store.prepare_repacked("default", progress=False)


@pytest.fixture(scope="session")
def vlm_int4_dir(default_model_dir) -> Path:
    """The embedded VLM (smolvlm-135m) in cpu_int4 at the default group, language model only,
    built once around the converted default model (cached under VLLM_EDGE_HOME)."""
    from vllm_edge.models import vlm
    from vllm_edge.quant.groups import DEFAULT_GROUP

    return vlm.prepare_quantized(default_model_dir, "cpu_int4", DEFAULT_GROUP, progress=False)


@pytest.fixture
def disk_full(monkeypatch):
    """Every safetensors save fails with RuntimeError("disk full"), as a full disk would."""
    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)


def _run_llm(fn, **llm_kwargs):
    from vllm import LLM, envs
    from vllm.distributed import cleanup_dist_env_and_memory

    # an engine freezes vLLM's environment variables at its start (enable_envs_cache): without
    # this, an engine reads the values the session's first engine saw, not the ones it is given
    envs.disable_envs_cache()
    old = os.environ.get(_MP)
    os.environ[_MP] = "0"  # one process: apply_model reaches the model, and cleanup frees it
    try:
        llm = LLM(**llm_kwargs)
        try:
            return fn(llm)
        finally:
            del llm  # the only reference, so the collection below frees the engine
    finally:
        gc.collect()
        cleanup_dist_env_and_memory()
        if old is None:
            os.environ.pop(_MP, None)
        else:
            os.environ[_MP] = old


@pytest.fixture(scope="session")
def run_llm():
    """``run_llm(fn, **llm_kwargs)``: build ``vllm.LLM(**llm_kwargs)`` in this process, return
    ``fn(llm)``, then tear the engine down and free its memory (also on error), so the next
    engine or a reference model starts clean. ``fn`` must not keep ``llm``."""
    return _run_llm
