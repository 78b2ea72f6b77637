"""Speculative decoding's engine arguments and the server defaults it must not carry (no
engine started)."""

from __future__ import annotations

import pytest

from vllm_edge.runtime import engine, speculative


def test_off_adds_nothing_and_ngram_adds_vllms_config(default_model_dir):
    off = engine.edge_engine(default_model_dir)
    assert "speculative_config" not in off.kwargs and "speculative_config" not in off.reasons
    on = engine.edge_engine(default_model_dir, speculative="ngram")
    assert on.kwargs["speculative_config"] == speculative.NGRAM
    assert "n-gram prompt lookup" in on.reasons["speculative_config"]
    with pytest.raises(ValueError, match="--speculative 'eagle': expected one of off, ngram"):
        engine.edge_engine(default_model_dir, speculative="eagle")


def test_vllm_takes_the_ngram_settings():
    from vllm.config import SpeculativeConfig

    cfg = SpeculativeConfig(**speculative.NGRAM)
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (
        "ngram", 4, 3, 4)


def test_a_min_p_default_is_neutralised_not_dropped():
    values, replaced = speculative.accepted_defaults({"temperature": 0.8, "min_p": 0.05})
    # sent as 0: vLLM lays the server's values over the model's generation_config.json
    assert values == {"temperature": 0.8, "min_p": 0.0} and replaced == {"min_p": 0.05}
    assert speculative.accepted_defaults({"temperature": 0.2, "top_p": 0.9}) == (
        {"temperature": 0.2, "top_p": 0.9}, {})
    assert speculative.accepted_defaults({"min_p": 0.0}) == ({"min_p": 0.0}, {})


def test_vllm_still_refuses_min_p_with_speculation():
    """The reason for the neutral default: if vLLM starts taking min_p, this fails and the
    replacement can go."""
    from vllm import SamplingParams
    from vllm.config import SpeculativeConfig
    from vllm.exceptions import VLLMValidationError

    spec = SpeculativeConfig(**speculative.NGRAM)
    with pytest.raises(VLLMValidationError, match="min_p and logit_bias"):
        SamplingParams(min_p=0.05)._validate_spec_decode(spec)
    SamplingParams(min_p=0.0)._validate_spec_decode(spec)


def test_auto_is_ngram_with_a_batch_schedule_vllm_expands_to_batch_one_only(default_model_dir):
    from vllm.config import SpeculativeConfig
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    from vllm_edge.runtime import speculative_gate

    auto = engine.edge_engine(default_model_dir, speculative="auto")
    cfg = auto.kwargs["speculative_config"]
    assert {k: v for k, v in cfg.items() if k != "num_speculative_tokens_per_batch_size"} == speculative.NGRAM
    assert auto.reasons["speculative_config"].startswith("auto:")
    # vLLM's own expansion, index = batch size: proposals of 4 tokens alone, none with company
    lookup = build_dynamic_sd_schedule_lookup(cfg["num_speculative_tokens_per_batch_size"], 8, 4)
    assert lookup == [0, 4, 0, 0, 0, 0, 0, 0, 0]
    vllm_cfg = SpeculativeConfig(**cfg)
    assert vllm_cfg.uses_dynamic_speculative_decoding() and speculative_gate.wants_gate(vllm_cfg)
    assert not speculative_gate.wants_gate(SpeculativeConfig(**speculative.NGRAM))
    assert not speculative_gate.wants_gate(None)


def test_the_proposal_length_comes_from_the_environment_for_both_methods(monkeypatch):
    from vllm.config import SpeculativeConfig
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    monkeypatch.setenv("VLLM_EDGE_NGRAM_TOKENS", "8")
    ngram, auto = speculative.engine_config("ngram"), speculative.engine_config("auto")
    assert ngram == {**speculative.NGRAM, "num_speculative_tokens": 8}
    assert SpeculativeConfig(**ngram).num_speculative_tokens == 8
    assert build_dynamic_sd_schedule_lookup(auto["num_speculative_tokens_per_batch_size"], 4, 8) == [0, 8, 0, 0, 0]
    assert "up to 8 proposed tokens" in speculative.reason("ngram")
    assert speculative.AUTO["num_speculative_tokens_per_batch_size"][0][2] == 4  # the default is not altered
    monkeypatch.setenv("VLLM_EDGE_NGRAM_TOKENS", "0")
    with pytest.raises(Exception, match="VLLM_EDGE_NGRAM_TOKENS"):
        speculative.engine_config("ngram")
