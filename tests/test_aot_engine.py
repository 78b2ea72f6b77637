"""Real engine, default multiprocess executor: the plugin runs inside the worker, the AOT
artifact saved by a cold start is loaded by the next one and answers as the compiled graph did,
and the bug returns without the patch.

The model is a 2-layer synthetic one with the default model's tokenizer: the mechanism does not
depend on the depth, and each compile is about 20 s shorter than the 30-layer default's (three
starts, two of them compiles)."""

from __future__ import annotations

import pytest

from vllm_edge.bench import aot_cache as aot_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def starts(tmp_path_factory, default_model_dir):
    from vllm_edge.models import synthetic

    work = tmp_path_factory.mktemp("aot")
    model = str(synthetic.build(work / "tiny", synthetic.Shape.derive(256, 2, 49152),
                                tokenizer_from=default_model_dir, progress=False))
    # Its own compile cache: this test is about caching.
    root = work / "vllm-cache"
    # `run --multiprocess`: vLLM's default executor, with its engine-core and worker processes.
    cold = aot_bench.one_start(model, root, multiprocess=True)
    warm = aot_bench.one_start(model, root, multiprocess=True)
    unpatched = aot_bench.one_start(model, root, {"VLLM_EDGE_PATCH_AOT_CACHE": "0"},
                                    multiprocess=True)
    return cold, warm, unpatched


def test_starts_succeeded(starts):
    for s in starts:
        assert s["returncode"] == 0, s.get("stderr_tail")


def test_patch_state_inside_the_worker_process(starts):
    cold, warm, unpatched = starts
    for s in (cold, warm):
        assert s["worker_pid"] != s["main_pid"]  # multiprocess: a separate worker process
        assert s["worker_patches"]["aot_cache"] == "applied"
    assert unpatched["worker_patches"]["aot_cache"] == "disabled"


def test_cold_start_compiles_and_saves(starts):
    cold = starts[0]
    assert cold["num_aot_compiles"] == 1 and cold["aot_saved"]
    assert not cold["direct_aot_load"]


def test_warm_start_loads_directly_and_compiles_nothing(starts):
    warm = starts[1]
    assert warm["direct_aot_load"] and not warm["aot_load_failure"]
    assert warm["num_aot_artifacts_loaded"] == 1
    assert warm["num_aot_compiles"] == 0 and warm["num_inductor_compiles"] == 0
    assert not warm["aot_saved"]
    assert warm["aot_noop_attached"]  # the shim is what made the load work


def test_without_the_patch_the_upstream_bug_recompiles(starts):
    unpatched = starts[2]
    assert unpatched["aot_load_failure"] and not unpatched["direct_aot_load"]
    assert any("finalize_loading" in r for r in unpatched["load_failure_reasons"])
    assert unpatched["num_aot_compiles"] == 1


def test_the_loaded_graph_answers_as_the_compiled_one(starts):
    # greedy (`run`'s default temperature): the loaded artifact computes what the compile made
    cold, warm, unpatched = starts
    assert cold["answer"].strip(), cold
    assert warm["answer"] == cold["answer"] == unpatched["answer"]
