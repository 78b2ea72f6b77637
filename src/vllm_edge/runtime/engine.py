"""Engine arguments for an edge box, built in one place for `run` and `serve`.

Every choice carries its reason, so `run` can print it and results can record it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_edge.runtime.kv import kv_budget_for, kv_heads_per_rank

WORKER_EXTENSION = "vllm_edge.runtime.worker_ext.EdgeWorkerExtension"
# vLLM 0.32's CPU platform sets block_size=128 unless the user chose one.
CPU_BLOCK_SIZE = 128
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass
class EdgeEngine:
    kwargs: dict[str, Any]
    reasons: dict[str, str] = field(default_factory=dict)
    # Environment to set in this process before vLLM (and torch) are imported.
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"engine_args": self.kwargs, "env": self.env, "reasons": self.reasons}

    def explain(self) -> list[str]:
        """One line per choice, ``key=value: why``."""
        def shown(v: Any) -> str:
            text = str(v)
            return text if len(text) <= 80 else f"<{len(text)} chars>"  # e.g. a chat template

        return [f"{key}={shown(self.kwargs.get(key, self.env.get(key)))}: {why}"
                for key, why in self.reasons.items()]

    def apply_env(self) -> None:
        import os

        os.environ.update(self.env)


def edge_engine(model_path: str | Path, *, max_model_len: int = 2048, max_num_seqs: int = 4,
                dtype: str = "bfloat16", enforce_eager: bool = False,
                kv_cache_memory_bytes: int | None = None, one_process: bool = True,
                enable_prefix_caching: bool = True, server: bool = False,
                max_num_batched_tokens: int | None = None,
                worker_extension: str = WORKER_EXTENSION, tensor_parallel_size: int = 1,
                pipeline_parallel_size: int = 1, nnodes: int = 1,
                speculative: str = "off", priority: str = "speed") -> EdgeEngine:
    """``server``: the arguments are for vLLM's API server (`serve`), whose AsyncLLM always
    runs the engine core in a process of its own; ``one_process`` then keeps the worker
    inside that engine-core process. ``worker_extension`` is the class vLLM mixes into the
    worker (benchmarks pass one with their measurement calls). ``max_num_batched_tokens``:
    the most tokens one step runs (longer prompts prefill in chunks); it also sizes the
    dummy forward vLLM runs at start (vLLM's CPU default for ``LLM`` is 4096).
    ``tensor_parallel_size``/``pipeline_parallel_size``: ranks in vLLM's multiprocess
    executor, ``nnodes`` machines sharing them (see :func:`parallel_layout`). ``speculative``:
    a method of :mod:`vllm_edge.runtime.speculative` (``off`` or ``ngram``). ``priority``:
    ``speed`` or ``fidelity``, which decides the products' activations
    (:mod:`vllm_edge.runtime.activations`)."""
    model_path = Path(model_path)
    from vllm_edge.common import model_config

    config = model_config.read(model_path)
    reasons: dict[str, str] = {}
    ranks = {"tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size}
    world = tensor_parallel_size * pipeline_parallel_size
    per_rank = " per rank" if world > 1 else ""
    budget = kv_budget_for(config, max_model_len, max_num_seqs, dtype, CPU_BLOCK_SIZE, **ranks)
    priced = kv_cache_memory_bytes is None
    if priced:
        kv_cache_memory_bytes = budget.flat_bytes
        reasons["kv_cache_memory_bytes"] = (
            f"priced from the config{per_rank}: {budget.num_layers} layers x "
            f"{budget.bytes_per_token_per_layer} B/token x {budget.tokens_per_seq} tokens x "
            f"{max_num_seqs} seqs + 1 null block (vLLM's default reserves a fraction of all RAM)"
        )
    else:
        need = kv_budget_for(config, max_model_len, 1, dtype, CPU_BLOCK_SIZE, **ranks).flat_bytes
        if kv_cache_memory_bytes < need:
            raise ValueError(
                f"kv_cache_memory_bytes={kv_cache_memory_bytes} is too small for one sequence of "
                f"max_model_len={max_model_len}: the minimum is {need} bytes "
                f"({need / 2**20:.1f} MiB); raise the budget or lower max_model_len"
            )
        reasons["kv_cache_memory_bytes"] = "given explicitly"
    kwargs = {
        "model": str(model_path),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "kv_cache_memory_bytes": int(kv_cache_memory_bytes),
        "enforce_eager": enforce_eager,
        "worker_extension_cls": worker_extension,
    }
    reasons["worker_extension_cls"] = "lets `run` ask the worker which patches it applied"
    reasons["max_num_seqs"] = (f"{max_num_seqs} sequences decode together; the KV budget is priced "
                               "for all of them at full length")
    reasons["enforce_eager"] = "requested" if enforce_eager else "compiled graph (cached by the AOT fix)"
    from vllm_edge.runtime import kv_groups

    kv_groups.apply(kwargs, reasons, budget, priced)
    kwargs["enable_prefix_caching"] = enable_prefix_caching
    if max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
        reasons["max_num_batched_tokens"] = (
            f"{max_num_batched_tokens} tokens per step, longer prompts prefill in chunks: vLLM's "
            "start-up dummy forward is this long, and on CPU its default (4096 for LLM, 2048 "
            "for the API server) costs seconds")
    reasons["enable_prefix_caching"] = (
        "chat turns share their prefix" if enable_prefix_caching else "off, as for pp measurements")
    from vllm_edge.runtime import speculative as spec

    spec_config = spec.engine_config(speculative)
    if spec_config is not None:
        kwargs["speculative_config"] = spec_config
        reasons["speculative_config"] = spec.reason(speculative)

    from vllm_edge.kernels import rms_norm

    op_priority = rms_norm.engine_priority()
    if op_priority:
        kwargs["ir_op_priority"] = op_priority
        reasons["ir_op_priority"] = (
            f"{rms_norm.ENV_SWITCH}=1: vLLM's _C norm kernels on CPU ({rms_norm.PROVIDER}), "
            "native where the arguments do not fit (or where the build lacks the kernels)")

    from vllm_edge.common.hw import probe_cpu

    cpu = probe_cpu()
    cores = cpu.allowed_cpus
    env: dict[str, str] = {}
    if world > 1:
        parallel_layout(kwargs, reasons, env, cores, tensor_parallel_size, pipeline_parallel_size,
                        nnodes, one_process, server)
    elif one_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        reasons["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
            "two processes, the API server and one engine core that runs the model itself: "
            "vLLM's async server always starts the engine core apart, but with 0 the CPU "
            "platform keeps the worker inside it instead of spawning a third process with its "
            "own copy of torch and vLLM"
            if server else
            "one process: no engine-core and worker processes to spawn, import and fill with "
            "their own copies of torch and vLLM")
        threads, why = thread_count(cores)
        env["OMP_NUM_THREADS"] = str(threads)
        reasons["OMP_NUM_THREADS"] = why
    else:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        reasons["VLLM_ENABLE_V1_MULTIPROCESSING"] = "multiprocess executor requested"
    from vllm_edge.runtime import attention_split

    attention_split.apply(env, reasons, kv_heads_per_rank(config, tensor_parallel_size),
                          attention_threads(env, cores, world // max(nnodes, 1)))
    from vllm_edge.runtime import activations

    activations.apply(env, reasons, priority, bool(cpu.isa.get("avx512_vnni")))
    if not enforce_eager:
        from vllm_edge.runtime import cpp_wrapper

        cpp_wrapper.apply(kwargs, env, reasons)
    return EdgeEngine(kwargs, reasons, env)


def parallel_layout(kwargs: dict[str, Any], reasons: dict[str, str], env: dict[str, str],
                    cores: list[int], tp: int, pp: int, nnodes: int, one_process: bool,
                    server: bool) -> None:
    """One worker process per rank, each bound to its own share of the allowed cores.

    vLLM's automatic binding gives each local rank a NUMA node of its own (and refuses when
    there are fewer nodes than ranks, as on every single-socket box); here the allowed cores
    are split evenly between the ranks of this machine instead, and any left over stay with
    the scheduler. A binding the user set in VLLM_CPU_OMP_THREADS_BIND is kept."""
    from vllm_edge import envs

    world = tp * pp
    if nnodes < 1 or world % nnodes:
        raise ValueError(f"--nnodes {nnodes} must divide the {world} ranks "
                         f"(tensor {tp} x pipeline {pp})")
    local = world // nnodes
    kwargs.update(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                  distributed_executor_backend="mp")
    reasons["tensor_parallel_size"] = f"{tp} ranks split each layer" if tp > 1 else "1"
    reasons["pipeline_parallel_size"] = f"{pp} stages split the layers" if pp > 1 else "1"
    reasons["distributed_executor_backend"] = (
        "mp: one worker process per rank" + (f", {local} of them on this machine" if nnodes > 1 else ""))
    given = envs.get(BIND_ENV)
    if given and given not in ("auto", ""):
        reasons[BIND_ENV] = "given in the environment"
    else:
        if len(cores) < local:
            raise ValueError(
                f"{local} ranks on this machine need at least one core each, but only "
                f"{len(cores)} are allowed ({cores}); lower --tensor-parallel-size or "
                "--pipeline-parallel-size, or add machines with --nnodes")
        share = len(cores) // local
        lists = [cores[i * share:(i + 1) * share] for i in range(local)]
        env[BIND_ENV] = "|".join(",".join(map(str, c)) for c in lists)
        spare = cores[share * local:]
        reasons[BIND_ENV] = (
            f"{share} core(s) per rank: vLLM's automatic binding wants one NUMA node per rank"
            + (f"; cores {spare} stay with the scheduler" if spare else ""))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if one_process else "1"
    reasons["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
        ("the engine core stays in " + ("the server's engine process" if server else "this process")
         + "; only the ranks get processes of their own")
        if one_process else "multiprocess engine core requested")


def attention_threads(env: dict[str, str], cores: list[int], local_ranks: int) -> int:
    """The threads one rank's attention runs on: the edge mode's own count where it set one,
    else the rank's share of the allowed cores."""
    if "OMP_NUM_THREADS" in env:
        return int(env["OMP_NUM_THREADS"])
    return max(1, len(cores) // max(local_ranks, 1))


def thread_count(cores: list[int]) -> tuple[int, str]:
    """Compute threads for one-process mode, and why."""
    from vllm_edge import envs

    asked = envs.get("VLLM_EDGE_THREADS")
    if asked is not None:
        if asked > len(cores):
            return len(cores), (f"VLLM_EDGE_THREADS={asked} capped to the {len(cores)} allowed "
                                f"cores {cores}: more threads than cores only wait on each other")
        return asked, f"VLLM_EDGE_THREADS={asked} (of {len(cores)} allowed cores {cores})"
    return len(cores), (f"all {len(cores)} allowed cores {cores}: vLLM's own binding needs the "
                        "multiprocess executor, and it reserves one core for the frontend")
