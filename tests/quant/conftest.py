"""Fixtures for cpu_int4 tests: a one-process vLLM distributed context for building layers."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def vllm_dist(tmp_path_factory):
    """vLLM layers ask for the tensor-parallel group; give them a world of one."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        cleanup_dist_env_and_memory,
        init_distributed_environment,
        initialize_model_parallel,
    )

    init_file = tmp_path_factory.mktemp("dist") / "init"
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"file://{init_file}", backend="gloo")
        initialize_model_parallel(1, 1)
        yield
        cleanup_dist_env_and_memory()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
