"""Sampling defaults: the model's own values where it has them, each source in its order,
else the truncated-tail fallback; nothing here starts an engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_edge.serving import sampling


def test_the_embedded_model_gets_its_model_cards_settings(tmp_path):
    d = sampling.for_model("default", tmp_path)
    assert d.values == {"temperature": 0.2, "top_p": 0.9}
    assert d.source == "SmolLM2-135M-Instruct's recommended settings"
    assert "temperature 0.2, top_p 0.9" in d.explain()


def test_a_generation_config_wins(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "bos_token_id": 1, "do_sample": True}))
    d = sampling.for_model("default", tmp_path)
    assert d.values == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert d.source == "the model's generation_config.json"


def test_a_folder_that_names_nothing_gets_the_truncated_tail(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    d = sampling.for_model(str(tmp_path), tmp_path)
    assert d.values == sampling.FALLBACK and d.values["top_k"] and d.values["min_p"]
    assert "repetition_penalty" not in d.values  # greedy answers stay greedy


def test_a_gguf_files_sampling_metadata(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_float32("general.sampling.temp", 0.3)
    w.add_int32("general.sampling.top_k", 30)
    w.add_float32("general.sampling.min_p", 0.1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    d = sampling.for_model(str(path), tmp_path / "build")
    assert d.source == "the GGUF file's general.sampling metadata"
    assert d.values == pytest.approx({"temperature": 0.3, "top_k": 30, "min_p": 0.1})
