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


@pytest.fixture(scope="session")
def native_op_loaded():
    """The C++ op's kernel, built once (cached under VLLM_EDGE_HOME/kernels) and loaded; skips
    where the native product does not run (the op is only built where it does)."""
    from vllm_edge.quant import native, native_op, ops

    if not {"avx512_bf16", "avx512vbmi"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU lacks AVX512-BF16 or VBMI: no native product, so no native op")
    ops.register()
    if not native_op.load():
        pytest.fail(f"the native op did not load here ({native_op.state()}); g++ is installed on this host")
    return native_op
