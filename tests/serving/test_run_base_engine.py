"""`vllm-edge run --prompt` on a base model (a GGUF without a chat template: the Gemma 3 270M
file of its PyPI packages): the prompt is completed as plain text, in this process and through
the keep-alive server, with one line that says so. A chat is refused with what to do instead."""

from __future__ import annotations

import json

import pytest

from support.cli_runner import run_cli
from support.llamacpp import gemma3_gguf

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gguf():
    return str(gemma3_gguf())


def test_in_this_process_the_prompt_is_completed(gguf):
    from transformers import AutoTokenizer

    from vllm_edge.serving.serve import BASE_MODEL_LINE

    proc = run_cli("run", "--model", gguf, "--keep-alive", "0", "--enforce-eager", "-o", "json",
                   "--max-tokens", "8", "--prompt", PROMPT, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "completion" and BASE_MODEL_LINE in proc.stderr
    # the prompt's own tokens with the file's <bos>, no template around them (an earlier build
    # read the folder's missing template as "null", and vLLM failed to open it as a file)
    tok = AutoTokenizer.from_pretrained(result["model"])
    assert result["prompt_tokens"] == len(tok(PROMPT).input_ids)
    assert result["generated_tokens"] == 8 and result["answer"].strip()


def test_through_the_keep_alive_server_the_prompt_is_completed(gguf):
    from vllm_edge.serving.serve import BASE_MODEL_LINE

    try:
        proc = run_cli("run", "--model", gguf, "--keep-alive", "60s", "--enforce-eager",
                       "--max-tokens", "8", "--prompt", PROMPT, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert BASE_MODEL_LINE in proc.stderr and "(8 tokens)" in proc.stderr
        assert proc.stdout.strip()
    finally:
        run_cli("stop", "--all", timeout=120)
