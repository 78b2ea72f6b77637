"""pp/tg arithmetic, argument checks and the measurement core, with a fake clock: no engine."""

from __future__ import annotations

import json

import pytest

from vllm_edge.bench import speed
from vllm_edge.bench.speed import SpeedArgError, SpeedConfig
from vllm_edge.cli import main
from vllm_edge.cli.bench import speed as speed_cli
from vllm_edge.common import pinning
from vllm_edge.common.errors import UsageError
from vllm_edge.quant.groups import DEFAULT_GROUP


def test_pp_and_tg_arithmetic():
    assert speed.pp_tps(512, 0.5) == 1024.0
    # 128 tokens in 3.0 s, 1 token in 0.46 s: 127 decode steps in 2.54 s.
    assert speed.tg_tps(128, 3.0, 0.46) == pytest.approx(127 / 2.54)
    assert speed.tg_tps(128, 3.0, 0.46, seqs=4) == pytest.approx(4 * 127 / 2.54)
    with pytest.raises(ValueError, match="inside the noise"):
        speed.tg_tps(128, 0.4, 0.46)
    with pytest.raises(ValueError, match="at least 2"):
        speed.tg_tps(1, 1.0, 0.5)
    with pytest.raises(ValueError):
        speed.pp_tps(512, 0.0)


def test_llama_bench_keys():
    assert speed.pp_key(512) == "pp512_tps"
    assert speed.tg_key(128) == "tg128_tps"
    assert speed.tg_key(128, 4096) == "tg128_at_d4096_tps"
    assert speed.batch_key(8) == "b8_tg_tps"


def test_context_len_beyond_max_model_len_is_rejected():
    with pytest.raises(SpeedArgError, match=r"--context-len 8100 needs 8228 positions.*8192"):
        speed.validate(SpeedConfig(context_lens=(8100,)), model_max_len=8192)
    with pytest.raises(SpeedArgError, match=r"max_model_len is 1024 \(--max-model-len\)"):
        speed.validate(SpeedConfig(context_lens=(1000,), max_model_len=1024), model_max_len=8192)
    with pytest.raises(SpeedArgError, match="--prompt-len"):
        speed.validate(SpeedConfig(prompt_len=600, max_model_len=512))


def test_validate_returns_the_needed_length():
    assert speed.validate(SpeedConfig(), 8192) == 513
    assert speed.validate(SpeedConfig(context_lens=(1024,)), 8192) == 1024 + 128
    assert speed.validate(SpeedConfig(max_model_len=4096), 8192) == 4096


@pytest.mark.parametrize("cfg, msg", [
    (SpeedConfig(tg_tokens=1), "--tg-tokens"),
    (SpeedConfig(reps=0), "--reps"),
    (SpeedConfig(prompt_len=0), "--prompt-len"),
    (SpeedConfig(threads=0), "--threads"),
])
def test_bad_numbers(cfg, msg):
    with pytest.raises(SpeedArgError, match=msg):
        speed.validate(cfg)


def test_int_lists_and_core_sets():
    assert pinning.parse_int_list("1,4,8", "--batch") == (1, 4, 8)
    assert pinning.parse_int_list(None, "--batch") == ()
    with pytest.raises(UsageError, match="--batch"):
        pinning.parse_int_list("1,x", "--batch")
    with pytest.raises(UsageError, match="at least 1"):
        pinning.parse_int_list("0,4", "--batch")
    assert pinning.parse_int_list("0,1", "--cpus", minimum=0) == (0, 1)


def test_core_zero_is_a_core_on_every_command_line():
    import argparse

    from vllm_edge.cli.bench import speed as speed_cli

    p = argparse.ArgumentParser()
    speed_cli.add_args(p)
    cfg = speed_cli.config_from_args(p.parse_args(["--cpus", "0,1", "--tensor-parallel-size", "2"]))
    assert cfg.cpus == (0, 1) and cfg.tensor_parallel_size == 2
    assert pinning.core_set(None, None, [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert pinning.core_set((3, 1), None, [0, 1, 2, 3]) == [1, 3]
    assert pinning.core_set(None, 2, [0, 1, 2, 3]) == [0, 1]
    with pytest.raises(UsageError, match="exceeds"):
        pinning.core_set((0, 1), 3, [0, 1, 2, 3])
    with pytest.raises(UsageError, match="not in"):
        pinning.core_set((7,), None, [0, 1])


def test_cli_rejects_context_len_before_any_engine(capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("engine must not start")

    monkeypatch.setattr(speed, "run", boom)
    monkeypatch.setattr(speed_cli, "pin", boom)
    assert main(["bench", "speed", "--context-len", "9000", "--reps", "1"]) == 2
    assert "--context-len 9000 needs 9128 positions" in capsys.readouterr().err


class FakeClock:
    """prefill costs `pre` s per token, decode `dec` s per token per sequence step."""

    def __init__(self, pre=0.001, dec=0.02, batch_dec=0.005):
        self.pre, self.dec, self.batch_dec = pre, dec, batch_dec
        self.calls = []

    def __call__(self, prompts, max_tokens):
        self.calls.append(([len(p) for p in prompts], max_tokens, [p[0] for p in prompts]))
        prefill = self.pre * sum(len(p) for p in prompts)
        step = self.dec + self.batch_dec * (len(prompts) - 1)
        return prefill + step * (max_tokens - 1)


def test_measure_cancels_prefill_and_uses_distinct_prompts():
    clock = FakeClock()
    cfg = SpeedConfig(prompt_len=64, tg_tokens=9, context_lens=(200,), batches=(1, 4), reps=2)
    src = speed.TokenSource(list(range(10_000)))
    out = speed.measure(clock, cfg, src)
    runs = out["runs"]
    assert set(runs) == {"pp64_tps", "tg9_tps", "tg9_at_d200_tps", "b1_tg_tps", "b4_tg_tps"}
    assert all(len(v) == 2 for v in runs.values())
    assert runs["pp64_tps"][0] == pytest.approx(64 / (0.001 * 64))
    # prefill cancels: decode rate is independent of depth
    assert runs["tg9_tps"][0] == pytest.approx(1 / 0.02)
    assert runs["tg9_at_d200_tps"][0] == pytest.approx(1 / 0.02)
    assert runs["b4_tg_tps"][0] == pytest.approx(4 / (0.02 + 3 * 0.005))
    # the 1-token and N-token runs share a prompt; everything else is distinct
    pairs = [c for c in clock.calls if c[1] in (1, 9) and c[0] != [64]]
    firsts = [tuple(c[2]) for c in clock.calls]
    assert pairs[0][2] == pairs[1][2]
    batch4 = next(c for c in clock.calls if len(c[0]) == 4)
    assert len(set(batch4[2])) == 4
    assert len(set(firsts)) == len(firsts) - sum(1 for c in clock.calls if c[1] == 9)
    summ = speed.summarize(runs)
    assert summ["tg9_tps"]["direction"] == "higher" and summ["tg9_tps"]["n"] == 2


def test_token_source_wraps():
    src = speed.TokenSource([1, 2, 3])
    assert src.take(5) == [1, 2, 3, 1, 2]
    assert src.take(2) == [3, 1]


def test_metric_line_holds_only_metrics():
    res = {"build": "m (bfloat16, eager)", "load_s": 3.0,
           "metrics": {"pp64_tps": {"median": 100.0}, "tg8_tps": {"median": 20.0}},
           "memory_phases": {"load_peak_rss_anon_mb": 500.0, "bench_peak_rss_anon_mb": 700.0}}
    line = speed.metric_line(res)
    assert line == {"benchmark": "speed", "build": "m (bfloat16, eager)", "pp64_tps": 100.0,
                    "tg8_tps": 20.0, "load_s": 3.0, "peak_rss_anon_mb": 700.0}


def test_quant_picks_the_build_run_runs(default_model_dir, default_repacked_dir):
    from vllm_edge.models import store

    path = speed.model_path(SpeedConfig(quant="cpu_int4", group=DEFAULT_GROUP))
    assert path == default_repacked_dir == store.embedded_dir("default", "cpu_int4", DEFAULT_GROUP)
    assert json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"] == "cpu_int4"
    assert speed.model_path(SpeedConfig()) == default_model_dir


def test_quant_with_a_directory_model_is_refused(tmp_path):
    with pytest.raises(SpeedArgError, match="--quant cpu_int4 needs an embedded model name"):
        speed.model_path(SpeedConfig(model=str(tmp_path), quant="cpu_int4"))


def test_cli_rejects_a_missing_bandwidth_file_and_quant_on_a_directory(capsys, monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("engine must not start")

    monkeypatch.setattr(speed, "run", boom)
    monkeypatch.setattr(speed_cli, "pin", boom)
    assert main(["bench", "speed", "--bandwidth", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err
    assert main(["bench", "speed", "--model", str(tmp_path), "--quant", "cpu_int4"]) == 2
    assert "--quant cpu_int4 needs an embedded model name" in capsys.readouterr().err


def test_metric_line_carries_weight_bytes():
    res = {"build": "m", "load_s": 3.0, "metrics": {"pp64_tps": {"median": 100.0}},
           "memory_phases": {"load_peak_rss_anon_mb": 500.0},
           "weights": {"weights_resident_mb": 80.5, "dequant_workspace_mb": 3.4}}
    line = speed.metric_line(res)
    assert line["weights_resident_mb"] == 80.5 and line["dequant_workspace_mb"] == 3.4


def test_weight_bytes_from_the_ledger_split_workspace_and_opaque():
    class FakeLLM:
        def collective_rpc(self, name):
            assert name == "vllm_edge_ledger"
            return [{"roles": {"packed weights": {"resident_mb": 60.0, "allocated_mb": 61.0},
                               "buffers": {"resident_mb": 1.0, "allocated_mb": 1.0},
                               "workspace": {"resident_mb": 3.4, "allocated_mb": 3.4}},
                     "opaque_packed_handles": {"handles": 2, "estimated_mb": 12.0}}]

    assert speed.weight_bytes(FakeLLM()) == {
        "weights_resident_mb": 61.0, "weights_allocated_mb": 62.0,
        "weights_opaque_est_mb": 12.0, "dequant_workspace_mb": 3.4}


def test_weight_bytes_without_a_ledger_is_empty():
    class Plain:
        def collective_rpc(self, name):
            raise AttributeError(name)

    assert speed.weight_bytes(Plain()) == {}


def test_a_json_schema_is_named_or_read_and_a_bad_one_refused(tmp_path):
    assert speed.constraint_schema("long-text") is speed.LONG_TEXT_SCHEMA
    f = tmp_path / "s.json"
    f.write_text('{"type": "object"}')
    assert speed.constraint_schema(str(f)) == {"type": "object"}
    for text, msg in (("[1]", "a JSON schema is an object"), ("{", "not JSON")):
        f.write_text(text)
        with pytest.raises(SpeedArgError, match=msg):
            speed.validate(speed.SpeedConfig(json_schema=str(f)))
    with pytest.raises(SpeedArgError, match="missing.json"):
        speed.constraint_schema(str(tmp_path / "missing.json"))
