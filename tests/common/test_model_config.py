"""config.json readers: a deeply nested config (a hostile one raised an uncaught
RecursionError in the engine's and the server's readers) and a non-object get one clear
error naming the file, from every reader of a model folder's config."""

from __future__ import annotations

import json

import pytest

from vllm_edge.common import model_config
from vllm_edge.common.errors import EdgeError

DEEP = b'{"architectures": ["LlamaForCausalLM"], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
NESTED = json.dumps({"architectures": ["LlamaForCausalLM"], "x": json.loads("[" * 500 + "]" * 500)})


@pytest.fixture(params=["deep", "nested", "array"])
def bad_folder(request, tmp_path):
    body = {"deep": DEEP, "nested": NESTED.encode(), "array": b"[1, 2]"}[request.param]
    (tmp_path / "config.json").write_bytes(body)
    (tmp_path / "tokenizer_config.json").write_bytes(body)
    return tmp_path


def _readers():
    from vllm_edge.models import resolver
    from vllm_edge.models.gptq_repack import read_gptq_config
    from vllm_edge.quant.quantize import read_source_config
    from vllm_edge.serving.serve import own_template

    return {"model_config.read": model_config.read, "resolver.read_config": resolver.read_config,
            "quantize.read_source_config": read_source_config, "gptq_repack.read_gptq_config": read_gptq_config,
            "serve.own_template": own_template}


@pytest.mark.parametrize("name", sorted(_readers()))
def test_every_reader_names_the_file(bad_folder, name):
    with pytest.raises(EdgeError, match=r"config\.json: (nested deeper than 64 levels|expected a JSON object)"):
        _readers()[name](bad_folder)


def test_the_engine_reader_refuses_a_deep_config(bad_folder):
    from vllm_edge.runtime.engine import edge_engine

    with pytest.raises(EdgeError, match="config.json"):
        edge_engine(bad_folder, max_model_len=128)


def test_image_and_store_probes_take_a_bad_config_as_none(bad_folder):
    from vllm_edge.models import store
    from vllm_edge.runtime.images import model_accepts_images

    assert model_accepts_images(bad_folder) is False
    assert store.quant_method(bad_folder) is None


def test_a_real_config_reads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"rope_scaling": {"a": [1]}}}))
    assert model_config.read(tmp_path)["text_config"]["rope_scaling"] == {"a": [1]}
    assert model_config.positive_int({"n": 4.0}, "n") == 4
    for bad in (0, -1, True, "4", 1.5, None):
        with pytest.raises(model_config.ModelConfigError, match="positive integer"):
            model_config.positive_int({"n": bad}, "n")
