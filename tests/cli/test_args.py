"""Parsing without running: shared flags, the renamed flags, and defaults kept in step with
the library (moved here from tests/quant/test_quantize.py and tests/bench/test_fidelity_cli.py)."""

from __future__ import annotations

import pytest

from vllm_edge.cli import build_parser
from vllm_edge.quant.groups import DEFAULT_GROUP


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_cli_parses_quantize():
    args = parse("quantize", "a", "b", "--group", "128")
    assert (args.src, args.dst, args.quant, args.group) == ("a", "b", "cpu_int4", 128)
    assert args.func.__module__ == "vllm_edge.cli.quantize"
    assert parse("quantize", "a", "b", "--quant", "gptq").quant == "gptq"
    assert parse("quantize", "a", "b").group == DEFAULT_GROUP == 32


@pytest.mark.parametrize("argv", [["quantize", "a", "b"], ["models", "prepare"], ["models", "build-vlm"],
                                  ["bench", "speed"], ["bench", "profile"], ["fidelity", "--ref", "r"]])
def test_every_group_flag_takes_32_and_refuses_96(argv, capsys):
    assert build_parser().parse_args([*argv, "--group", "32"]).group == 32
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--group", "96"])
    assert "invalid choice: 96" in capsys.readouterr().err


def test_quantize_group_help_names_the_real_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["quantize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{DEFAULT_GROUP} = 5.0 (default)" in text
    assert "64 = 4.5 (default)" not in text


def test_needs_exactly_one_mode():
    p = build_parser()
    with pytest.raises(SystemExit):
        p.parse_args(["fidelity"])
    with pytest.raises(SystemExit):
        p.parse_args(["fidelity", "--save-ref", "a", "--ref", "b"])
    args = p.parse_args(["fidelity", "--ref", "r", "--corpus-chunks", "2"])
    assert args.ref == "r" and args.corpus_chunks == 2 and args.kl_k == 10


@pytest.mark.parametrize("cmd", [["run"], ["serve"]])
def test_weight_path_is_quant_auto_or_none(cmd, capsys):
    from vllm_edge.cli.args import weight_dtype

    assert parse(*cmd).quant == "auto"
    assert weight_dtype(parse(*cmd, "--quant", "none").quant) == "bf16"
    assert weight_dtype(parse(*cmd).quant) == "auto"
    for old in (["--dtype", "bf16"], ["--quant", "bf16"]):
        with pytest.raises(SystemExit):
            parse(*cmd, *old)
    capsys.readouterr()


@pytest.mark.parametrize("cmd", [["doctor"], ["run"]])
def test_output_replaces_json(cmd, capsys):
    assert parse(*cmd).output == "md"
    assert parse(*cmd, "-o", "json").output == "json"
    assert parse(*cmd, "--output", "json").output == "json"
    with pytest.raises(SystemExit):
        parse(*cmd, "--json")
    capsys.readouterr()


def test_torch_dtype_flags_keep_their_name():
    for cmd in (["bench", "speed"], ["bench", "profile"], ["fidelity", "--ref", "r"]):
        assert parse(*cmd, "--dtype", "float16").dtype == "float16"
        assert parse(*cmd).dtype == "bfloat16"


@pytest.mark.parametrize("cmd", [["compare"], ["grid", "spec.json"], ["bench", "speed"], ["bandwidth"],
                                 ["bench", "llamacpp", "--gguf", "f"], ["bench", "profile"]])
def test_one_name_for_the_core_set(cmd, capsys):
    assert parse(*cmd, "--cpus", "0,1").cpus == "0,1"
    with pytest.raises(SystemExit):
        parse(*cmd, "--cores", "0,1")
    capsys.readouterr()


def test_init_memory_child_flags():
    args = parse("bench", "init-memory", "--child", "--model", "m", "--kv-gib", "1", "--no-release")
    assert (args.child, args.model, args.kv_gib, args.no_release) == (True, "m", 1, True)


def test_child_flags_need_child(capsys):
    from vllm_edge.cli import main

    assert main(["bench", "init-memory", "--kv-gib", "1"]) == 2
    assert "--kv-gib and --no-release need --child" in capsys.readouterr().err


def test_help_defaults_match_the_library():
    """Defaults the CLI modules repeat or take from torch-free modules match the library's."""
    from vllm_edge.bench.fidelity import engine, run
    from vllm_edge.bench.micro import int4
    from vllm_edge.cli.bench import int4_micro
    from vllm_edge.quant import groups, pack

    assert tuple(sorted(int4.SETS)) == tuple(sorted(int4_micro.SETS))
    assert pack.KERNEL_GROUPS == groups.KERNEL_GROUPS
    assert parse("fidelity", "--ref", "r").kl_k == engine.DEFAULT_KL_K
    assert parse("fidelity", "--ref", "r").corpus_chunks == run.DEFAULT_CORPUS_CHUNKS
    assert parse("bench", "int4-micro").threads == 2


def test_every_spec_arm_parses(capsys):
    """The grid specs we ship run `python -m vllm_edge.cli ...`, with flags the parser takes."""
    import json
    from pathlib import Path

    specs = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "specs").glob("*.json"))
    assert specs
    seen = 0
    for spec in specs:
        for arm in json.loads(spec.read_text())["arms"]:
            cmd = arm["cmd"]
            assert cmd[1:3] == ["-m", "vllm_edge.cli"], (spec.name, cmd)
            try:
                parse(*cmd[3:])
            except SystemExit:
                pytest.fail(f"{spec.name}: {arm['name']}: {capsys.readouterr().err}")
            seen += 1
    assert seen > 10


@pytest.mark.parametrize("cmd", [["run"], ["serve"]])
def test_speculative_is_off_by_default_and_takes_ngram_and_auto(cmd, capsys):
    from vllm_edge.runtime.speculative import METHODS

    assert parse(*cmd).speculative == "off"
    assert parse(*cmd, "--speculative", "ngram").speculative == "ngram"
    assert parse(*cmd, "--speculative", "auto").speculative == "auto"
    assert METHODS == ("off", "ngram", "auto")
    with pytest.raises(SystemExit):
        parse(*cmd, "--speculative", "eagle")
    capsys.readouterr()


def test_run_hands_speculative_to_the_engine_and_to_a_keep_alive_server(monkeypatch):
    """In this process it reaches serving.run.run; through a keep-alive server, the options the
    server is started with."""
    from vllm_edge import cli
    from vllm_edge.serving import keepalive
    from vllm_edge.serving import run as serving_run

    seen = {}

    class Stop(Exception):
        pass

    def in_process(**kwargs):
        seen["in_process"] = kwargs["speculative"]
        raise Stop

    def ensure(model, quant, keep_s, options, **kwargs):
        seen["server"] = options["speculative"]
        raise Stop

    monkeypatch.setattr(serving_run, "run", in_process)
    monkeypatch.setattr(keepalive, "ensure", ensure)
    for argv in (["run", "--keep-alive", "0"], ["run", "--prompt", "hi"]):
        with pytest.raises(Stop):
            cli.main([*argv, "--speculative", "ngram"])
    assert seen == {"in_process": "ngram", "server": "ngram"}
