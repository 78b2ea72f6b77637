"""`vllm-edge compare`: its grid specs, its pair verdicts, and docs/results/comparisons.md rendered from
real grid summaries of fake arms (no engine starts here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_edge.bench import compare, speed
from vllm_edge.bench.grid import runner as grid
from vllm_edge.common import stats
from vllm_edge.common.errors import EdgeError, UsageError
from vllm_edge.quant.groups import DEFAULT_GROUP

# What llama.cpp arms printed before they decoded batches (old artifacts must still render).
OLD_BATCH_NOTE = "unsupported in llama-cpp-python's API"

PATHS = {"vllm-bf16": Path("/m/bf16"), "vllm-cpu_int4": Path("/m/int4"),
         "llamacpp-BF16": Path("/g/m.bf16.gguf"), "llamacpp-Q4_K_M": Path("/g/m.bf16.Q4_K_M.gguf"),
         "llamacpp-Q4_0": Path("/g/m.bf16.Q4_0.gguf"), "llamacpp-Q8_0": Path("/g/m.bf16.Q8_0.gguf")}


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_speed_spec_runs_both_engines_through_the_same_keys_and_threads():
    spec = grid.load_spec(compare.build_spec(PATHS, threads=2, cores=[0, 1], batch=8, reps=1))
    assert [a.name for a in spec["arms"]] == list(PATHS)
    assert spec["metrics"] == [speed.tg_key(128), speed.pp_key(512), speed.batch_key(8), "load_s",
                               "peak_rss_anon_mb"]
    for arm in spec["arms"]:
        assert _flag(arm.cmd, "--threads") == "2" and _flag(arm.cmd, "--batch") == "8"
        assert _flag(arm.cmd, "--reps") == "1"
        llama = arm.name.startswith("llamacpp-")
        assert (arm.cmd[2:5] == ["vllm_edge.cli", "bench", "llamacpp"]) == llama  # `vllm-edge bench llamacpp`
        assert ("speed" in arm.cmd) == (not llama)  # `vllm-edge bench speed`
        assert ("--no-mmap" in arm.cmd) == llama  # weights in RssAnon on both sides
    assert spec["cores"] == [0, 1]


def test_fidelity_spec_scores_each_engine_against_its_own_bf16(tmp_path):
    spec = compare.fidelity_spec(PATHS, ref_dir=tmp_path / "ref", out_dir=tmp_path / "fid", threads=2,
                                 greedy_tokens=16, chunks=2)
    arms = {a["name"]: a["cmd"] for a in spec["arms"]}
    assert list(arms)[0] == compare.REF_ARM  # one pass keeps spec order: the reference exists first
    assert _flag(arms[compare.REF_ARM], "--save-ref") == _flag(arms["vllm-cpu_int4"], "--ref")
    assert _flag(arms[compare.REF_ARM], "--model") == str(PATHS["vllm-bf16"])
    for q in compare.GGUF_QUANTS:
        cmd = arms[f"llamacpp-{q}"]
        assert _flag(cmd, "--ref") == str(PATHS["llamacpp-BF16"])
        assert _flag(cmd, "--cand") == str(PATHS[f"llamacpp-{q}"])
        assert _flag(cmd, "--tokenizer") == str(PATHS["vllm-bf16"])
        assert _flag(cmd, "--chunks") == "2" and _flag(cmd, "--greedy-tokens") == "16"
    # Same corpus size, greedy length and KL definition on both engines.
    assert _flag(arms["vllm-cpu_int4"], "--corpus-chunks") == "2"
    assert _flag(arms["vllm-cpu_int4"], "--greedy-tokens") == "16"
    assert _flag(arms["vllm-cpu_int4"], "--kl-k") == _flag(arms["llamacpp-Q4_K_M"], "--kl-k")
    grid.load_spec(spec)


def test_builds_derive_from_one_bf16_directory():
    b = compare.builds("default")
    assert b["llamacpp-Q4_0"].name == "smollm2-135m.bf16.Q4_0.gguf"
    assert b["llamacpp-BF16"].parent == b["llamacpp-Q8_0"].parent
    s = compare.builds(synthetic_1b=True)
    assert s["vllm-bf16"].name == "synthetic-llama-1b"
    # the default group and g64, each its own arm
    assert s["vllm-cpu_int4"].name == f"synthetic-llama-1b-cpu_int4-g{DEFAULT_GROUP}"
    assert s["vllm-cpu_int4-g64"].name == "synthetic-llama-1b-cpu_int4-g64"
    assert "vllm-cpu_int4-g64" not in b
    assert s["llamacpp-Q4_K_M"].name == "synthetic-llama-1b.bf16.Q4_K_M.gguf"


def test_arm_selection_names_unknown_arms():
    b = compare.builds("default")
    assert list(compare.select(b, ["vllm-cpu_int4", "llamacpp-Q4_K_M"])) == ["vllm-cpu_int4", "llamacpp-Q4_K_M"]
    with pytest.raises(UsageError, match="vllm-cpu_int4-g64"):
        compare.select(b, ["vllm-cpu_int4-g64"])


def _as_host(out: Path, dest: Path, model: str) -> Path:
    """A copy of a compare run whose provenance names another CPU."""
    shutil.copytree(out, dest)
    summary = dest / "speed" / "summary.json"
    data = json.loads(summary.read_text())
    data["provenance"]["cpu"]["model"] = model
    data["provenance"]["cpu"].pop("family", None)  # this machine's numbers are not that CPU's
    summary.write_text(json.dumps(data))
    return dest


def test_each_host_has_its_own_section_on_the_shared_page(compare_out, tmp_path):
    results = tmp_path / "shared" / "benchmarks" / "results"
    for model in ("Zen Test CPU", "Xeon Test CPU"):
        host = compare.recorded_host(_as_host(compare_out, results / "compare" / "tmp", model))
        (results / "compare" / "tmp").rename(results / "compare" / compare.host_slug(host))
    doc = tmp_path / "shared" / "docs" / "results" / "comparisons.md"
    doc.parent.mkdir(parents=True)
    text, _ = compare.page(results, doc)
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h.split(": ")[1].split(",")[0] for h in heads] == ["Xeon Test CPU", "Zen Test CPU"]
    for part, cpu in zip(text.split("\n## ")[1:], ("Xeon Test CPU", "Zen Test CPU")):
        # each section's tables say their own host, and only it
        assert f"host: **{cpu}," in part and ("Zen" if cpu.startswith("Xeon") else "Xeon") not in part
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert (doc.parent / target).exists(), target


def test_a_run_never_replaces_another_hosts(compare_out, tmp_path):
    kept = compare.recorded_host(compare_out)
    compare.refuse_other_host(compare_out, kept)  # the same host may measure again
    compare.refuse_other_host(tmp_path / "empty", "Other CPU, AVX2, 2 cores")
    with pytest.raises(EdgeError, match=re.escape(f"measured on {kept}; this host is Other CPU")):
        compare.refuse_other_host(compare_out, "Other CPU, AVX2, 2 cores")
    assert compare.host_slug("AMD EPYC, AVX512-BF16, 2 cores") == "amd-epyc-avx512-bf16-2-cores"


def _s(values: list[float], metric: str) -> dict:
    return stats.summarize(values, metric)


def test_pair_verdict_follows_direction_and_noise():
    # llama.cpp clearly faster at decode: ratio < 1 and llama.cpp ahead.
    v = compare.pair_verdict("tg128_tps", _s([50, 52, 51], "tg128_tps"), _s([100, 101, 99], "tg128_tps"))
    assert v["ratio"] == pytest.approx(51 / 100) and v["verdict"] == "llama.cpp ahead"
    # Lower is better for memory: vLLM's smaller peak wins.
    v = compare.pair_verdict("peak_rss_anon_mb", _s([300, 301, 302], "peak_rss_anon_mb"),
                             _s([500, 505, 510], "peak_rss_anon_mb"))
    assert v["verdict"] == "vLLM ahead"
    # Overlapping ranges, or a single run, are not a ranking.
    v = compare.pair_verdict("pp512_tps", _s([90, 110, 100], "pp512_tps"), _s([95, 105, 100], "pp512_tps"))
    assert v["verdict"] == stats.NOT_A_RANKING
    # one pass a side: no ranking, and the pass count said (the pair's own verdict)
    assert compare.pair_verdict("pp512_tps", _s([50], "pp512_tps"), _s([100], "pp512_tps"))["verdict"] \
        == f"{stats.NOT_A_RANKING}; n=1"
    two = compare.pair_verdict("tg128_tps", _s([50, 51], "tg128_tps"), _s([100, 101], "tg128_tps"))
    assert two["verdict"] == "llama.cpp ahead; n=2"
    assert compare.pair_verdict("b8_tg_tps", _s([50], "b8_tg_tps"), _s([], "b8_tg_tps"))["ratio"] is None


def _speed_line(tg, pp, load, peak, batch=None, llama=False, old=False):
    line = {"benchmark": "speed", "tg128_tps": tg, "pp512_tps": pp, "load_s": load, "peak_rss_anon_mb": peak}
    if llama:
        line["engine"] = "llama.cpp"
    if old:  # an old llama.cpp arm: no batch number, the reason instead
        line["batch"] = OLD_BATCH_NOTE
    else:
        line["b8_tg_tps"] = batch
    return line


def _write_compare_out(fake_arm, grid_kwargs, tmp_path, old_llama: bool = False) -> Path:
    """A compare output directory written by the real grid from fake arms."""
    out = tmp_path / "results" / "compare"
    ll = lambda *a: _speed_line(*a, llama=True, old=old_llama)  # noqa: E731
    v = {"vllm-bf16": [_speed_line(40, 800, 17, 1100, 150), _speed_line(42, 820, 16, 1120, 155),
                       _speed_line(41, 810, 16.5, 1110, 152)],
         "vllm-cpu_int4": [_speed_line(70, 700, 18, 840, 200), _speed_line(75, 690, 17, 845, 210),
                           _speed_line(72, 710, 17.5, 850, 205)],
         "llamacpp-BF16": [ll(80, 700, 0.2, 400, 300), ll(80, 700, 0.2, 400, 310), ll(80, 700, 0.2, 400, 305)],
         "llamacpp-Q4_K_M": [ll(110, 480, 0.2, 300, 190), ll(112, 490, 0.2, 302, 195),
                             ll(108, 485, 0.2, 301, 192)],
         "llamacpp-Q4_0": [ll(71, 650, 0.2, 280, 250), ll(80, 700, 0.2, 280, 260), ll(74, 660, 0.2, 280, 255)],
         "llamacpp-Q8_0": [ll(100, 460, 0.2, 330, 280)] * 3}
    spec = {"name": "compare-speed", "metrics": compare.speed_metrics(),
            "arms": [fake_arm(n, vals) for n, vals in v.items()]}
    grid.run_grid(spec, 3, out / "speed", **{k: v for k, v in grid_kwargs.items() if k != "out_dir"})
    fid = {"vllm-cpu_int4": {"exact_matches": 5, "kept_fraction": 0.6, "first_token_agreement": 0.9,
                             "top1_agreement": 0.92, "kl_mean": 0.04, "kl_median": 0.01, "kl_p99": 0.5,
                             "delta_logprob": -0.03, "coverage": 0.99},
           "llamacpp-Q4_K_M": {"exact_matches": 4, "kept_fraction": 0.5, "first_token_agreement": 0.9,
                               "top1_agreement": 0.906, "kl_mean": 0.05, "kl_median": 0.02, "kl_p99": 0.6,
                               "delta_logprob": -0.04, "coverage": 1.0, "kl_full_mean": 0.054}}
    fspec = {"name": "compare-fidelity", "metrics": compare.FIDELITY_METRICS,
             "arms": [fake_arm(compare.REF_ARM, [{"benchmark": "fidelity-reference"}])]
             + [fake_arm(n, [vals]) for n, vals in fid.items()]}
    fspec["arms"][-1]["cmd"] += ["--greedy-tokens", "32"]
    work = {k: v for k, v in grid_kwargs.items() if k not in ("out_dir", "lock_path")}
    grid.run_grid(fspec, 1, out / "fidelity", lock_path=tmp_path / "l2", **work)
    (out / "fidelity" / "llamacpp-Q4_K_M.json").write_text(json.dumps(
        {"greedy": {"exact_matches_str": "4/12"}, "teacher_forced": {"positions": 1020}, "kl_k": 10}))
    return out


@pytest.fixture
def compare_out(fake_arm, grid_kwargs, tmp_path):
    return _write_compare_out(fake_arm, grid_kwargs, tmp_path)


def test_doc_has_a_table_per_metric_ratios_flags_and_linked_sources(compare_out, tmp_path):
    doc = tmp_path / "docs" / "comparisons.md"
    res = compare.write_doc(compare_out, doc)
    text = doc.read_text()
    (tmp_path / "last_doc.md").write_text(text)
    for m in compare.speed_metrics():
        assert f"(`{m}`)" in text, m
    assert text.count("### ") >= 7  # how, headline, 5 metrics, fidelity
    # Decode: cpu_int4 median 72 vs Q4_K_M 110, ranges apart -> llama.cpp ahead, said so.
    assert "0.65× (llama.cpp ahead)" in text
    assert re.search(r"\*\*Where llama\.cpp wins:\*\*.*tg128_tps", text)
    # Q4_0's decode range (71-80) overlaps cpu_int4's (70-75): not a ranking.
    assert "vs Q4_0: 0.97× (NOT A RANKING)" in text
    # Memory: lower is better, vLLM's larger peak loses.
    assert "2.81× (llama.cpp ahead)" in text
    # Batch: a real llama.cpp number and ratio. bf16 152 vs BF16 305, ranges apart; cpu_int4 205 vs
    # Q4_K_M 192 (190-195 against 200-210): vLLM ahead.
    assert "| vllm-bf16 / llamacpp-BF16 | b8_tg_tps | 152 | 305 | 0.50× (llama.cpp ahead) |" in text
    assert "| vllm-cpu_int4 / llamacpp-Q4_K_M | b8_tg_tps | 205 | 192 | 1.07× (vLLM ahead) |" in text
    assert "not measured" not in text and OLD_BATCH_NOTE not in text
    # Grid flags carried over: Q4_0's decode spread is 12%.
    assert "NOISY" in text
    # Fidelity, each against its own bf16, with the KL ratio and the exact string from the artifact.
    assert "| vllm-cpu_int4 | vllm-bf16 | 5 |" in text and "| llamacpp-Q4_K_M | llamacpp-BF16 | 4/12 |" in text
    assert "0.80× (KL vs Q4_K_M's)" in text
    assert "1020 corpus positions" in text and "32 greedy tokens" in text
    # Every source link resolves from the doc's directory; every figure exists and is linked.
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert (doc.parent / target).exists(), target
    assert [Path(p).name for p in res["plots"]] == ["compare_speed.png", "compare_fidelity.png"]
    for p in res["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Source:" in text.split("compare_speed.png")[1][:400]


def test_old_artifacts_without_llamacpp_batch_still_render(fake_arm, grid_kwargs, tmp_path):
    out = _write_compare_out(fake_arm, grid_kwargs, tmp_path, old_llama=True)
    doc = tmp_path / "old.md"
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "compare", "--render-only",
                           "--out", str(out), "--doc", str(doc)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = doc.read_text()
    # The old arms' reason stands in place of the ratio, in the headline and the batch table.
    assert f"| vllm-bf16 / llamacpp-BF16 | b8_tg_tps | 152 | – | llama.cpp arm: {OLD_BATCH_NOTE} |" in text
    assert f"not measured: {OLD_BATCH_NOTE}" in text
    assert "0.65× (llama.cpp ahead)" in text  # the other metrics are unaffected


def test_regeneration_keeps_hand_written_text(compare_out, tmp_path):
    doc = tmp_path / "comparisons.md"
    doc.write_text("# Mine\n\nA note by hand.\n\n" + compare.BEGIN + "\nold\n" + compare.END + "\n\nAfter.\n")
    compare.write_doc(compare_out, doc)
    text = doc.read_text()
    assert text.startswith("# Mine\n\nA note by hand.") and text.rstrip().endswith("After.")
    assert "\nold\n" not in text and "Headline ratios" in text


def test_smoke_runs_are_marked(compare_out, tmp_path):
    (compare_out / "compare.json").write_text(json.dumps({"smoke": True, "command": "vllm-edge compare --smoke"}))
    doc = tmp_path / "c.md"
    compare.write_doc(compare_out, doc)
    assert "SMOKE RUN" in doc.read_text()


def test_render_only_without_artifacts_names_the_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "compare", "--render-only",
                           "--out", str(tmp_path / "none"), "--doc", str(tmp_path / "c.md")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert str(tmp_path / "none" / "speed" / "summary.json") in proc.stderr


def test_a_gguf_file_is_compared_with_itself_in_llama_cpp(tmp_path, monkeypatch):
    from support.checkpoints import tiny_llama_gguf
    from vllm_edge.models import gguf_import, store

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    f = tiny_llama_gguf(tmp_path / "My Model.Q4_K_M.gguf")
    b = compare.builds(str(f))
    sha = gguf_import.sha256_file(f)
    assert b[compare.FILE_ARM] == f.resolve()
    assert b["vllm-cpu_int4"] == store.gguf_build_dir(sha, "cpu_int4")  # the repack of the same file
    assert b["vllm-bf16"] == store.gguf_build_dir(sha, None)
    assert b["llamacpp-BF16"].name == f"gguf-{sha[:16]}.bf16.gguf"
    assert ("vllm-cpu_int4", compare.FILE_ARM) in compare.PAIRS
    assert compare.REFERENCES[compare.FILE_ARM] == "llamacpp-BF16"
    spec = compare.fidelity_spec(b, ref_dir=tmp_path / "ref", out_dir=tmp_path / "fid", threads=2)
    [arm] = [a for a in spec["arms"] if a["name"] == compare.FILE_ARM]
    assert _flag(arm["cmd"], "--cand") == str(f.resolve()) and _flag(arm["cmd"], "--ref") == str(b["llamacpp-BF16"])
    assert compare.user_slug(str(f)) == "My-Model.Q4_K_M"
    with pytest.raises(store.ModelNotAvailable, match="nope.gguf: no such GGUF file"):
        compare.builds(str(tmp_path / "nope.gguf"))
    assert compare.FILE_ARM not in compare.builds("default")


def test_a_file_our_exporter_does_not_write_is_compared_on_the_file_alone(tmp_path, monkeypatch):
    """llama.cpp's own quantizations come from our BF16 export, which writes Llama only: a Gemma 3
    file keeps the file arm (and the vLLM arms), and no arm that needs the export."""
    from support.checkpoints import tiny_gguf, tiny_llama_gguf

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    gemma = compare.builds(str(tiny_llama_gguf(tmp_path / "g.gguf", arch="gemma3")))
    assert compare.FILE_ARM in gemma and "vllm-cpu_int4" in gemma
    assert not any(k.startswith("llamacpp-") and k not in (compare.FILE_ARM, compare.amx_twin(compare.FILE_ARM))
                   for k in gemma)
    assert not compare.exports(tiny_gguf(tmp_path / "p.gguf", "phi3"))
    llama = compare.builds(str(tiny_llama_gguf(tmp_path / "l.gguf")))
    assert "llamacpp-BF16" in llama and "llamacpp-Q4_K_M" in llama


def test_a_gguf_file_is_also_scored_against_llama_cpp_on_the_file_itself(tmp_path, monkeypatch):
    """The same-file row: llama.cpp on the file saves the reference before vLLM's repack is scored
    against it, for a Llama file beside the bf16 rows, and as the only rows for another family."""
    from support.checkpoints import tiny_llama_gguf

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    for arch in ("llama", "qwen2"):
        b = compare.builds(str(tiny_llama_gguf(tmp_path / f"{arch}.gguf", arch=arch)))
        spec = compare.fidelity_spec(b, ref_dir=tmp_path / "ref", out_dir=tmp_path / "fid", threads=2,
                                     greedy_tokens=16, chunks=2)
        arms = {a["name"]: a["cmd"] for a in spec["arms"]}
        names = list(arms)
        assert names.index(compare.SAME_REF_ARM) == names.index(compare.SAME_ARM) - 1
        ref, cand = arms[compare.SAME_REF_ARM], arms[compare.SAME_ARM]
        assert _flag(ref, "--engine") == "llama.cpp" and _flag(ref, "--model") == str(b[compare.FILE_ARM])
        assert _flag(ref, "--save-ref") == _flag(cand, "--ref") != str(tmp_path / "ref")
        assert _flag(ref, "--tokenizer") == _flag(cand, "--model") == str(b["vllm-cpu_int4"])
        assert "--enforce-eager" not in ref  # llama.cpp refuses vLLM's flags
        assert _flag(ref, "--out") == str(tmp_path / "fid" / compare.fidelity_file(compare.SAME_REF_ARM))
        assert _flag(cand, "--out") == str(tmp_path / "fid" / compare.fidelity_file(compare.SAME_ARM))
        assert _flag(ref, "--corpus-chunks") == _flag(cand, "--corpus-chunks") == "2"
        assert ("llamacpp-Q4_K_M" in arms) == (arch == "llama")
        assert compare.REFERENCES[compare.SAME_ARM] == compare.FILE_ARM
        grid.load_spec(spec)
        # --arms: the pairs the selected arms make, and nothing that needs an arm left out
        sub = compare.select(b, ["vllm-cpu_int4", compare.FILE_ARM])
        assert [a["name"] for a in compare.fidelity_spec(sub, ref_dir=tmp_path / "ref", out_dir=tmp_path,
                                                         threads=2)["arms"]][:2] == [compare.SAME_REF_ARM,
                                                                                     compare.SAME_ARM]
    assert compare.fidelity_spec(compare.select(PATHS, ["vllm-cpu_int4", "llamacpp-Q4_K_M"]),
                                 ref_dir=tmp_path / "ref", out_dir=tmp_path, threads=2)["arms"] == []


def test_a_quantized_file_is_also_scored_against_its_exact_weights(tmp_path, monkeypatch):
    """Both engines against llama.cpp on an F32 copy of the file, saved before either is scored;
    not for a float file, whose weights llama.cpp already runs exactly."""
    from support.checkpoints import tiny_llama_gguf

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    quantized = compare.builds(str(tiny_llama_gguf(tmp_path / "q.gguf", arch="qwen2")))
    spec = compare.fidelity_spec(quantized, ref_dir=tmp_path / "ref", out_dir=tmp_path / "fid", threads=2,
                                 greedy_tokens=16, chunks=2)
    arms = {a["name"]: a["cmd"] for a in spec["arms"]}
    names = list(arms)
    assert names[-3:] == [compare.EXACT_REF_ARM, compare.EXACT_FILE_ARM, compare.EXACT_ARM]
    ref, llama, vllm = (arms[n] for n in names[-3:])
    assert "--dequantized" in ref and _flag(ref, "--engine") == "llama.cpp"
    assert _flag(ref, "--model") == _flag(llama, "--model") == str(quantized[compare.FILE_ARM])
    assert "--dequantized" not in llama and _flag(llama, "--engine") == "llama.cpp"
    assert _flag(vllm, "--model") == _flag(ref, "--tokenizer") == _flag(llama, "--tokenizer") \
        == str(quantized["vllm-cpu_int4"])
    exact = _flag(ref, "--save-ref")
    assert exact == _flag(llama, "--ref") == _flag(vllm, "--ref")
    assert exact not in (str(tmp_path / "ref"), _flag(arms[compare.SAME_REF_ARM], "--save-ref"))
    assert _flag(llama, "--out") == str(tmp_path / "fid" / compare.fidelity_file(compare.EXACT_FILE_ARM))
    assert _flag(vllm, "--out") == str(tmp_path / "fid" / compare.fidelity_file(compare.EXACT_ARM))
    grid.load_spec(spec)
    f32 = tiny_llama_gguf(tmp_path / "f.gguf", arch="qwen2", types={"blk.0.attn_q.weight": "F32",
                                                                     "blk.0.ffn_gate.weight": "F32"})
    names = [a["name"] for a in compare.fidelity_spec(compare.builds(str(f32)), ref_dir=tmp_path / "r2",
                                                      out_dir=tmp_path, threads=2)["arms"]]
    assert compare.SAME_ARM in names and compare.EXACT_REF_ARM not in names


def _fidelity_doc(fake_arm, grid_kwargs, tmp_path, arms: list[tuple[str, dict]]) -> tuple[Path, Path]:
    """A compare run whose fidelity grid holds ``arms`` (name, the line each run prints), and its
    page: (artifact directory, page)."""
    out = _write_compare_out(fake_arm, grid_kwargs, tmp_path)
    fspec = {"name": "compare-fidelity", "metrics": compare.FIDELITY_METRICS,
             "arms": [fake_arm(name, [line]) for name, line in arms]}
    shutil.rmtree(out / "fidelity")
    work = {k: v for k, v in grid_kwargs.items() if k not in ("out_dir", "lock_path")}
    grid.run_grid(fspec, 1, out / "fidelity", lock_path=tmp_path / "l3", **work)
    doc = tmp_path / "docs" / "comparisons.md"
    compare.write_doc(out, doc)
    return out, doc


def test_the_rows_against_the_exact_weights_say_which_engine_is_closer(fake_arm, grid_kwargs, tmp_path):
    _, doc = _fidelity_doc(fake_arm, grid_kwargs, tmp_path, [
        (compare.SAME_REF_ARM, {"benchmark": "fidelity-reference"}),
        (compare.SAME_ARM, {"top1_agreement": 0.91, "kl_mean": 0.0022, "kl_p99": 0.01}),
        (compare.EXACT_REF_ARM, {"benchmark": "fidelity-reference"}),
        (compare.EXACT_FILE_ARM, {"top1_agreement": 0.936, "kl_mean": 0.0015, "kl_p99": 0.005}),
        (compare.EXACT_ARM, {"top1_agreement": 0.948, "kl_mean": 0.0006, "kl_p99": 0.003})])
    text = doc.read_text()
    assert "both against the file's exact weights" in text
    head = "| vllm-cpu_int4 / llamacpp-file | fidelity {} (each vs the file's exact weights) | {} | {} | {} |"
    assert head.format("top1_agreement", 0.948, 0.936, "1.01× (vLLM closer to the exact weights)") in text
    assert head.format("kl_mean", 0.0006, 0.0015, "0.40× (vLLM closer to the exact weights)") in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {compare.EXACT_ARM} | {compare.EXACT_REF} |"))
    assert "KL vs llama.cpp's on the file" in row
    fid_part = text.split("### Fidelity")[1]
    assert compare.EXACT_REF_ARM not in fid_part and f"| {compare.EXACT_FILE_ARM} | {compare.EXACT_REF} |" in fid_part
    # the other way round, llama.cpp's win is named as one
    assert "llama.cpp closer to the exact weights" in compare.exact_rows(
        {"top1_agreement": 0.93, "kl_mean": 0.002}, {"top1_agreement": 0.94, "kl_mean": 0.001})[0][-1]


def test_the_same_file_row_is_rendered_with_its_reference(fake_arm, grid_kwargs, tmp_path):
    out, doc = _fidelity_doc(fake_arm, grid_kwargs, tmp_path, [
        (compare.SAME_REF_ARM, {"benchmark": "fidelity-reference"}),
        (compare.SAME_ARM, {"top1_agreement": 0.957, "kl_mean": 0.0061, "kl_p99": 0.05})])
    text = doc.read_text()
    assert "vLLM against llama.cpp on the same file" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {compare.SAME_ARM} | {compare.FILE_ARM} |"))
    assert "0.957" in row and "0.0061" in row
    assert f"| {compare.SAME_ARM} | same-file fidelity top1_agreement | 0.957" in text
    assert compare.SAME_REF_ARM not in text.split("### Fidelity")[1]  # the reference is no row
    assert "Tokenizers:" not in text  # no reference artifact, nothing claimed
    (out / "fidelity" / compare.fidelity_file(compare.SAME_REF_ARM)).write_text(json.dumps(
        {"tokenizer_agreement": {"identical": 11, "prompts": 12, "differs_on": ["long-context"]}}))
    compare.write_doc(out, doc)
    assert ("gives the token ids ours gives on 11 of 12 prompts" in doc.read_text()
            and "differs on long-context." in doc.read_text())


def test_a_folder_is_compared_from_itself(tmp_path, monkeypatch):
    from vllm_edge.models import store
    from vllm_edge.quant.quantize import QuantizeError

    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "home"))
    d = tmp_path / "my-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    b = compare.builds(str(d))
    sha = store.folder_sha256(d)
    assert b["vllm-bf16"] == d.resolve() and compare.FILE_ARM not in b
    assert b["vllm-cpu_int4"] == store.folder_build_dir(sha, "cpu_int4", DEFAULT_GROUP)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                               "quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(QuantizeError, match="my-llama/config.json: field quantization_config"):
        compare.builds(str(d))


def test_a_user_model_gets_its_own_page(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "render", lambda out, d, shown: ("BODY\n", []))
    doc = tmp_path / "c.md"
    compare.write_doc(tmp_path, doc, title="my.gguf")
    text = doc.read_text()
    assert text.startswith("# vLLM (vllm-edge) and llama.cpp, side by side: my.gguf")
    assert "SmolLM2" not in text and text.index(compare.BEGIN) < text.index("BODY") < text.index(compare.END)
    other = tmp_path / "notes.md"
    other.write_text("my notes\n")
    with pytest.raises(EdgeError, match="notes.md: has no"):
        compare.write_doc(tmp_path, other, title="my.gguf")
    assert other.read_text() == "my notes\n"


def test_each_section_names_the_llama_cpp_build_it_ran():
    # On an AMX CPU the same llama.cpp version is several times faster with its AMX kernels:
    # a section must say which build its llama.cpp figures are of, or that it does not know.
    amx = {"ggml": "0.25.3", "ggml_commit": "0c1e570", "amx_kernels": True,
           "features": {"CPU": {"AVX2": 1, "AVX512": 1, "AMX_INT8": 1, "OPENMP": 1, "AVX_VNNI": 0}},
           "cmake_args": "-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse", "cmake_args_source": "x"}
    line = compare.llamacpp_build_line(amx)
    assert "AMX kernels in" in line and "AVX2, AVX512, AMX_INT8" in line and "AVX_VNNI" not in line
    assert "`-DGGML_NATIVE=ON -DCMAKE_CXX_FLAGS=-fno-dse`" in line
    plain = {**amx, "amx_kernels": False, "cmake_args": ""}
    assert "AMX kernels not in" in compare.llamacpp_build_line(plain)
    assert "default build" in compare.llamacpp_build_line(plain)
    unknown = {**amx, "cmake_args": None, "cmake_args_source": "not recorded (no install record)"}
    assert compare.llamacpp_build_line(unknown).endswith("CMAKE_ARGS not recorded (no install record)")
    assert compare.llamacpp_build_line(None) == "not recorded"
    assert "OSError" in compare.llamacpp_build_line({"error": "OSError: x"})


def test_a_speed_only_run_names_the_build_its_llama_cpp_arms_reported():
    # A compare of a file our export does not write runs no fidelity, so its own process never
    # loads llama.cpp and its provenance has no build: the arms' metric lines do.
    plain = {"ggml": "0.25.3", "ggml_commit": "0c1e570", "amx_kernels": False}
    amx = {**plain, "amx_kernels": True}
    records = [{"arm": "vllm-cpu_int4", "output": {"tg128_tps": 1.0}},
               {"arm": "llamacpp-amx-file", "output": {"llama_cpp_build": amx}},
               {"arm": "llamacpp-file", "output": {"llama_cpp_build": plain}}]
    assert compare.plain_build({}, records) == plain
    assert compare.plain_build({}, records[:2]) is None  # only an AMX arm: not the plain build
    own = {**plain, "ggml": "0.26.0"}
    assert compare.plain_build({"llama_cpp": own}, records) == own


def _amx_build(tmp_path, monkeypatch, amx_cpu=True):
    """A stand-in AMX build in a stand-in environment, on a CPU with or without AMX."""
    from vllm_edge.common import hw, llamacpp_build

    lib = tmp_path / llamacpp_build.AMX_BUILD
    lib.mkdir()
    (lib / "libllama.so").write_bytes(b"\x7fELF")
    (lib / "libggml-cpu.so").write_bytes(b"\x7fELF..." + llamacpp_build.AMX_SYMBOL + b"_buffer_type")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    real = hw.probe_cpu()
    monkeypatch.setattr(hw, "probe_cpu", lambda *a, **k: hw.CpuInfo(
        arch=real.arch, model_name=real.model_name,
        isa={**real.isa, "amx_tile": amx_cpu, "amx_int8": amx_cpu}))
    return lib


def test_the_amx_build_adds_twin_arms_run_through_its_libraries(tmp_path, monkeypatch):
    lib = _amx_build(tmp_path, monkeypatch)
    b = compare.builds("default")
    # each quantized file twice: the environment's llama.cpp and the AMX build; bf16 has no AMX kernel
    for q in compare.GGUF_QUANTS:
        assert b[compare.amx_twin(f"llamacpp-{q}")] == b[f"llamacpp-{q}"]
    assert "llamacpp-amx-BF16" not in b
    spec = grid.load_spec(compare.build_spec(compare.select(b, ["llamacpp-Q4_0", "llamacpp-amx-Q4_0"]),
                                             threads=2))
    by = {a.name: a for a in spec["arms"]}
    assert by["llamacpp-amx-Q4_0"].env == {"LLAMA_CPP_LIB_PATH": str(lib)}
    assert not by["llamacpp-Q4_0"].env
    assert by["llamacpp-amx-Q4_0"].cmd == by["llamacpp-Q4_0"].cmd  # same file, same measurement
    assert ("vllm-cpu_int4", "llamacpp-amx-Q4_K_M") in compare.PAIRS


def test_no_amx_build_or_no_amx_cpu_means_no_twins(tmp_path, monkeypatch):
    _amx_build(tmp_path, monkeypatch, amx_cpu=False)
    assert not any(k.startswith(compare.AMX_PREFIX) for k in compare.builds("default"))
    with pytest.raises(EdgeError, match="--llamacpp-amx"):
        compare.build_spec({"llamacpp-amx-Q4_0": Path("/g/m.Q4_0.gguf")}, threads=2)
    # a library without the AMX kernels is not the AMX build
    from vllm_edge.common import llamacpp_build

    (tmp_path / llamacpp_build.AMX_BUILD / "libggml-cpu.so").write_bytes(b"\x7fELF plain")
    assert llamacpp_build.amx_build_dir() is None
