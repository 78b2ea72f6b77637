"""Docs cannot drift from the artifacts: every measured figure is rendered from its artifact.

- README's measured region (the headline claims), docs/results/measured.md (every claim),
  docs/results/results.md and docs/results/comparisons.md are re-rendered from
  benchmarks/results/ and compared with the committed text; docs/results/ holds nothing written
  by hand.
- Outside those, no doc quotes a measured figure (tok/s, MB, GB/s, ms, µs, an ×/x ratio): it
  names the artifact or the generated page instead.
- Every relative link in README.md and docs/ resolves, nothing points outside the repository,
  and no text cites the numbers of old tasks.
"""

from __future__ import annotations

import json
import statistics
import re
from pathlib import Path

import pytest

from vllm_edge.bench import compare
from vllm_edge.bench import render as bench_render
from vllm_edge.bench.render import load_artifacts, splice
from vllm_edge.bench.report import claims, guide_tables
from vllm_edge.bench.report import results as results_report

REPO = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
README = REPO / "README.md"
CHANGELOG = REPO / "CHANGELOG.md"
DOCS = REPO / "docs"
PAGE = REPO / claims.PAGE


def _diff(want: str, got: str) -> list[str]:
    a, b = want.splitlines(), got.splitlines()
    out = [f"committed: {x!r}\n   render: {y!r}" for x, y in zip(a, b) if x != y]
    if len(a) != len(b):
        out.append(f"line count {len(a)} committed vs {len(b)} rendered")
    return out


def readme_mismatches(readme_text: str, results_dir: Path, readme_path: Path = README) -> list[str]:
    want = splice(readme_text, claims.render(results_dir, readme_path), claims.BEGIN, claims.END)
    return _diff(readme_text, want)


def page_mismatches(page_text: str, results_dir: Path, page_path: Path = PAGE) -> list[str]:
    want = splice(claims.PAGE_DOC, claims.render_page(results_dir, page_path), claims.BEGIN, claims.END)
    return _diff(page_text, want)


def _region(text: str) -> str:
    return text[text.index(claims.BEGIN):text.index(claims.END)]


@pytest.fixture
def no_plots(monkeypatch):
    # Re-rendering must not rewrite the committed PNGs: the report holds the plot functions by
    # name, compare calls them through the render module.
    for module in (bench_render, results_report):
        for name in ("plot_speed", "plot_memory", "plot_fidelity"):
            monkeypatch.setattr(module, name, lambda *a, **k: None)


# --- README -------------------------------------------------------------------------

def test_readme_measured_region_matches_the_artifacts():
    bad = readme_mismatches(README.read_text(), REPO / RESULTS)
    assert not bad, ("README's measured region differs from the artifacts; regenerate it with "
                     "`vllm-edge report`:\n" + "\n".join(bad))


def test_a_tampered_readme_figure_fails():
    text = README.read_text()
    region = _region(text)
    m = re.search(r"\| (\d+) MB \|", region)
    assert m, "the region quotes at least one MB figure"
    tampered = text.replace(m.group(0), f"| {int(m.group(1)) + 8} MB |", 1)
    bad = readme_mismatches(tampered, REPO / RESULTS)
    assert bad and any(f"{int(m.group(1)) + 8} MB" in b for b in bad)


@pytest.mark.parametrize("artifact,key,on_readme", [
    ("grid/vlm/summary.json", ("metrics", "peak_rss_anon_mb", "arms", "bf16", "median"), False),
    ("grid/levers/summary.json", ("metrics", "peak_tree_rss_anon_mb", "arms", "edge (all levers)", "median"), True),
])
def test_a_changed_artifact_fails(monkeypatch, artifact, key, on_readme):
    real = claims.load

    def tampered(results_dir, name):
        data = real(results_dir, name)
        if name == artifact:
            data = json.loads(json.dumps(data))
            leaf = data
            for k in key[:-1]:
                leaf = leaf[k]
            leaf[key[-1]] += 8.0
        return data

    monkeypatch.setattr(claims, "load", tampered)
    assert page_mismatches(PAGE.read_text(), REPO / RESULTS)
    assert bool(readme_mismatches(README.read_text(), REPO / RESULTS)) is on_readme


def test_the_measured_page_matches_the_artifacts():
    bad = page_mismatches(PAGE.read_text(), REPO / RESULTS)
    assert not bad, (f"{claims.PAGE} differs from the artifacts; regenerate it with `vllm-edge report`:\n"
                     + "\n".join(bad))


def test_every_claim_names_a_build_and_host_and_links_its_artifact():
    page = PAGE.read_text()
    for c in claims.CLAIMS:
        fig = claims.evaluate(c, REPO / RESULTS)
        assert fig.build and "?" not in fig.build.split(" / "), c.label
        assert fig.host and "?" not in fig.host.split(" / "), c.label
        assert (REPO / RESULTS / c.artifact.partition(":")[0]).is_file(), c.artifact
        assert f"[{c.artifact}](../../benchmarks/results/{c.artifact.partition(':')[0]})" in page


def test_the_readme_holds_only_the_headline_each_row_under_its_host_with_its_section():
    region = _region(README.read_text())
    rows, host = [], None  # (row, the host line above its table)
    for ln in region.splitlines():
        m = re.match(r"^Host: \*\*(.+)\*\*\.$", ln)
        host = m.group(1) if m else host
        if ln.startswith("| ") and not ln.startswith("| figure "):
            rows.append((ln, host))
    by_label = {shown: c for c, shown in claims.headline_claims()}
    assert 5 <= len(rows) == len(by_label) <= 12
    sections = {claims.slug(c.section) for c in claims.CLAIMS}
    for row, row_host in rows:
        cells = [x.strip() for x in row.strip("|").split("|")]
        c = by_label[cells[0]]
        assert row_host == claims.evaluate(c, REPO / RESULTS).host, row
        anchor = re.search(r"\]\(docs/results/measured\.md#([\w-]+)\)", cells[4])
        assert anchor and anchor.group(1) in sections, row
    page_headings = {claims.slug(h) for h in re.findall(r"^## (.+)$", PAGE.read_text(), re.M)}
    assert sections == page_headings


def test_a_headline_naming_no_claim_fails(monkeypatch):
    monkeypatch.setattr(claims, "HEADLINE", (("aot_cache.json", "no such label", "x"),))
    with pytest.raises(KeyError, match="no such label"):
        claims.headline_claims()


def test_a_sampling_row_names_the_build_its_arm_ran():
    data = {"gguf": "m.Q4_1.gguf", "server_defaults": {"build": "m-cpu_int4"},
            "server_defaults_bf16": {"build": "m-bf16"}, "provenance": {}}
    assert claims._prov_build(data, ("arms", "vllm-defaults", "coherent")) == "m-cpu_int4 (served)"
    assert claims._prov_build(data, ("arms", "vllm-defaults-bf16", "coherent")) == "m-bf16 (served)"
    assert claims._prov_build(data, ("arms", "llamacpp-server", "france", "coherent")) == "m.Q4_1.gguf (llama.cpp)"
    assert claims._prov_build(data) == "m-cpu_int4 (served)"


def test_the_host_comes_from_the_provenance():
    prov = {"cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+"}, "core_set": [0, 1, 2, 3]}
    assert claims._host({"provenance": prov}) == "Intel Xeon Platinum 8480+, 4 cores"
    prov["cpu"]["isa"] = {"avx2": True, "avx512": True, "avx512_bf16": True, "amx_bf16": True}
    assert claims._host({"provenance": prov}) == "Intel Xeon Platinum 8480+, AMX-BF16, 4 cores"
    assert claims._host({}) is None


def test_noise_flags_travel_with_the_figure(tmp_path):
    # A grid cell flagged NOISY shows NOISY beside its figure, and a busy grid says so.
    grid = tmp_path / "g.json"
    cell = {"median": 2.0, "flags": ["NOISY"], "n": 3}
    grid.write_text(json.dumps({"arms": [{"name": "a", "cmd": ["x", "--model", "m", "--quant", "cpu_int4",
                                                                 "--group", "32"]}],
                                "busy_passes": [1], "metrics": {"t": {"arms": {"a": cell}}}}))
    fig = claims.evaluate(claims.Claim("s", "l", "g.json", ("metrics", "t", "arms", "a"), "{:.1f}",
                                       target=(">=", 2.5)), tmp_path)
    assert fig.text == "2.0 (target ≥ 2.5: not met)"
    assert "NOISY" in fig.flags and "busy passes [1]" in fig.flags
    assert fig.build == "m cpu_int4 g32"


def test_a_target_verdict_inside_the_noise_is_not_met(tmp_path):
    # A ratio whose arms' passes overlap cannot meet a target of 1: its verdict says so,
    # while arms apart get met / not met from every pairing of their passes.
    def verdict(a, b):
        art = tmp_path / "r.json"
        cells = {n: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
                 for n, v in (("a", a), ("b", b))}
        art.write_text(json.dumps({"metrics": {"t": {"arms": cells}}}))
        claim = claims.Claim("s", "l", "r.json", ("metrics", "t", "arms", "a"), "{:.2f}x",
                             per=(None, ("metrics", "t", "arms", "b")), target=(">=", 1.0))
        fig = claims.evaluate(claim, tmp_path)
        return fig.text.split(": ", 1)[1].rstrip(")"), fig.flags

    text, flags = verdict([98, 106, 110], [95, 100, 104])  # median ratio 1.06, ranges overlap
    assert text == "inside the noise" and "NOT A RANKING" in flags
    assert verdict([110, 112, 115], [95, 100, 104])[0] == "met"
    assert verdict([80, 85, 90], [95, 100, 104])[0] == "not met"


# --- docs/results/ ------------------------------------------------------------------

def test_results_md_is_generated_only(monkeypatch, no_plots):
    monkeypatch.chdir(REPO)  # the report names artifacts relative to the repository, as the CLI does
    doc = Path(results_report.DEFAULT_DOC)
    arts, skipped = load_artifacts(RESULTS, RESULTS)
    body, _ = results_report.render(arts, skipped, Path(RESULTS), doc, RESULTS)
    want = splice(results_report.NEW_DOC, body, results_report.BEGIN, results_report.END)
    bad = _diff(doc.read_text(), want)
    assert not bad, "docs/results/results.md differs from `vllm-edge report`'s output:\n" + "\n".join(bad)


def test_comparisons_md_is_generated_only(monkeypatch, no_plots):
    monkeypatch.chdir(REPO)
    doc = Path(compare.DEFAULT_DOC)
    want, _ = compare.page(RESULTS, doc)
    bad = _diff(doc.read_text(), want)
    assert not bad, ("docs/results/comparisons.md differs from `vllm-edge compare --render-only`'s "
                     "output:\n" + "\n".join(bad))


def test_docs_results_holds_only_generated_files():
    assert sorted(p.name for p in (DOCS / "results").iterdir()) == ["README.md", "comparisons.md", "measured.md",
                                                                     "results.md"]


def test_the_audit_trail_matches_the_artifacts():
    doc = REPO / results_report.AUDIT_DOC
    want = splice(results_report.AUDIT_NEW, results_report.render_audit(REPO / RESULTS, doc, REPO),
                  results_report.BEGIN, results_report.END)
    bad = _diff(doc.read_text(), want.replace(str(REPO / RESULTS), RESULTS))
    assert not bad, f"{results_report.AUDIT_DOC} differs from the artifacts; run `vllm-edge report`:\n" + "\n".join(bad)


# --- the guides' generated tables -------------------------------------------------------

@pytest.mark.parametrize("rel,markers,render", guide_tables.REGIONS,
                         ids=[m[0].split("-table")[0].lstrip("<!- ") for _, m, _ in guide_tables.REGIONS])
def test_guide_tables_match_the_artifacts(rel, markers, render):
    doc = REPO / rel
    text = doc.read_text()
    assert markers[0] in text and markers[1] in text, f"{rel}: the generated table's markers are gone"
    want = splice(text, render(REPO / RESULTS, doc), *markers)
    bad = _diff(text, want)
    assert not bad, f"{rel}: the generated table differs from the artifacts; run `vllm-edge report`:\n" + "\n".join(bad)


def test_a_changed_agent_artifact_changes_the_table(tmp_path):
    import shutil

    doc = REPO / guide_tables.AGENT_DOC
    results = tmp_path / "results"
    shutil.copytree(REPO / RESULTS / "agent", results / "agent")
    before = guide_tables.render_agent(results, doc)
    victim = sorted((results / "agent").glob("*.json"))[0]
    data = json.loads(victim.read_text())
    data["summary"]["passed"] += 1
    victim.write_text(json.dumps(data))
    assert guide_tables.render_agent(results, doc) != before


def test_a_changed_same_file_artifact_changes_the_models_table(tmp_path):
    """The same-file table reads the fidelity artifact each compare run wrote, not a copy."""
    doc = REPO / guide_tables.MODELS_DOC
    run = tmp_path / "results" / "compare_x.Q4_K_M" / "some-host"
    (run / "fidelity").mkdir(parents=True)
    art = run / "fidelity" / compare.fidelity_file(compare.SAME_ARM)
    data = {"teacher_forced": {"top1_agreement": 0.957, "kl_mean": 0.0043},
            "greedy": {"exact_matches_str": "9/12"},
            "repack": {"source": "x.Q4_K_M.gguf", "gguf_types": ["Q4_K", "Q6_K"], "runtime_bytes_vs_gguf": 1.01}}
    art.write_text(json.dumps(data))
    before = guide_tables.render_same_file(tmp_path / "results", doc)
    assert "| `x.Q4_K_M.gguf` | Q4_K, Q6_K | 1.010x | 0.957 | 0.0043 | 9/12 |" in before
    data["teacher_forced"]["kl_mean"] = 0.0431
    art.write_text(json.dumps(data))
    assert "| 0.957 | 0.0431 | 9/12 | – | – | – |" in guide_tables.render_same_file(tmp_path / "results", doc)
    # the run's rows against the file's exact weights, vLLM's then llama.cpp's
    for arm, top1, kl in ((compare.EXACT_ARM, 0.948, 0.0006), (compare.EXACT_FILE_ARM, 0.936, 0.0015)):
        (run / "fidelity" / compare.fidelity_file(arm)).write_text(
            json.dumps({"teacher_forced": {"top1_agreement": top1, "kl_mean": kl}}))
    assert "| 9/12 | – | 0.948 / 0.936 | 0.0006 / 0.0015 |" in guide_tables.render_same_file(tmp_path / "results", doc)
    (run / "fidelity" / compare.fidelity_file(compare.SAME_REF_ARM)).write_text(json.dumps(
        {"benchmark": "fidelity-reference", "tokenizer_agreement": {"identical": 11, "prompts": 12,
                                                                      "differs_on": ["long-context"]}}))
    assert "| 9/12 | 11/12 | 0.948 / 0.936 |" in guide_tables.render_same_file(tmp_path / "results", doc)
    # the row names the file the run was given, not the copy of its bytes that built the repack
    data["reference_model"] = "/models/given-name.Q4_K_M.gguf"
    art.write_text(json.dumps(data))
    assert "| `given-name.Q4_K_M.gguf` | Q4_K, Q6_K |" in guide_tables.render_same_file(tmp_path / "results", doc)


def test_the_build_of_a_served_weights_directory():
    assert guide_tables.build_name("/x/models/smollm2-135m-cpu_int4-g32") == "cpu_int4 g32"
    assert guide_tables.build_name("/x/models/smollm2-135m-cpu_int4-g32-repack") == \
        "cpu_int4 g32, the GGUF's codes"
    assert guide_tables.build_name("/x/models/smollm2-135m-bf16") == "bf16"
    assert guide_tables.build_name("/x/models/other") == "other"


# --- no hand-copied figures -----------------------------------------------------------

# A measured figure: a rate, a size in MB, a bandwidth, a time in ms or µs, or a ratio like 2.01×
# or 3.7x (a shape such as 4096×4096 is not one). MiB/GiB are left out: they are settings
# (limits, budgets), not measurements. These count wherever they stand, code included.
MEASURED = re.compile(
    r"\d(?:[\d,.]*\d)?\s?(?:tok/s|tokens/s|MB\b|GB/s|ms\b|µs\b)"
    r"|(?<![\w.])\d+(?:\.\d+)?\s?[×x](?![\w×]|\.\d|\s*\d)"
)
# The units a setting shares with a result: seconds, percents, GB, a KL or top-1 value, a count
# like 10/12. In prose they are results unless SETTING says otherwise.
PROSE_FIGURE = re.compile(
    r"\d(?:[\d,.]*\d)?\s?(?:s\b|%|GB\b)"
    r"|\bKL\b[^|\n]{0,12}?\d*\.\d+"
    r"|\btop-1\b(?:\s+(?:agreement|of|=|:))?\s*\d"
    r"|(?<![\w./-])\d+ ?/ ?\d+(?![\w/.-])"
)
# What is not a result, and so may be written by hand: code (a command, a flag's value, a formula,
# a program's printed format) and a value a word marks as chosen rather than measured: a default,
# a target, a threshold, a budget, a bound (at least/at most, above/below, ≥/≤), a period (every),
# a tolerance (within), a leading share (the first N%).
_NUM = r"\d(?:[\d,.]*\d)?(?:\s?(?:s\b|%|GB\b|/\s?\d+))?"
SETTING = re.compile(
    r"(?:\bdefaults?(?: to| of)?|\btargets?(?: of)?|\bthreshold(?: of)?|\bat least|\bat most|\bup to|"
    r"\babove|\bbelow|\bevery|\bwithin|\bfirst|[≤≥<>])\s*" + _NUM
    + r"|" + _NUM + r"\s+(?:by default|default|budget|timeout|limit|deadline|target)\b"
)
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(line: str) -> str:
    return SETTING.sub(" ", re.sub(r"`[^`]*`", " ", line))


def measured_figures(text: str) -> list[str]:
    hits, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if MEASURED.search(line) or (not in_code and PROSE_FIGURE.search(_prose(line))):
            hits.append(line.strip())
    return hits


def _without_generated(text: str) -> str:
    from vllm_edge.bench import compare

    for begin, end in [*(markers for _, markers, _ in guide_tables.REGIONS), (compare.BEGIN, compare.END)]:
        if begin in text:
            text = text[:text.index(begin)] + text[text.index(end):]
    return text


def _hand_written_docs() -> dict[str, str]:
    docs = {str(p.relative_to(REPO)): _without_generated(p.read_text()) for p in sorted(DOCS.rglob("*.md"))
            if p.parent.name != "results"}
    text = README.read_text()
    docs["README.md (outside the measured region)"] = (text[:text.index(claims.BEGIN)]
                                                       + text[text.index(claims.END):])
    docs["CHANGELOG.md"] = CHANGELOG.read_text()
    for p in sorted((REPO / RESULTS).rglob("*.md")):  # notes beside the artifacts quote none either
        docs[str(p.relative_to(REPO))] = _without_generated(p.read_text())
    return docs


def hand_copied(docs: dict[str, str]) -> dict[str, list[str]]:
    return {name: hits for name, text in docs.items() if (hits := measured_figures(text))}


def test_the_figure_check_can_fail():
    for s in ("tg128 96.7 tok/s", "peak 1372 MB", "2.01× bf16", "tinygemm measured at 3.7x bf16",
              "takes 458 µs", "13.0 GB/s", "11.8 ms a step", "0.71× Q4_K_M",
              "ready in 20.1 s", "throughput swings by about 30%", "RSS went from 0.9 to 2.4 GB",
              "teacher-forced top-1 0.949", "a KL of 0.0123", "agree on 10/12", "8 / 4 answered",
              "```\ntg128 96.7 tok/s\n```"):
        assert measured_figures(s), s
    for s in ("a 4096×4096 GEMM", "512x512 image", "20 MiB", "group 32", "x86_64", "`--group 64`",
              "vocabulary 49152", "1024 rows", "49216 × 576", "4 × 512-token chunks",
              "`--noisy-pct` (10% by default)", "the targets are top-1 at least 0.95 and KL at most 0.02",
              "RssAnon spread above 5%", "sampled every 2 s", "a 270 s budget", "≥ 14/16 exact",
              "`bench soak --duration 60`", "```\nPASS (4/4 valid calls, 1.10 s/turn)\n```",
              "within 60 s", "the first 20% of the duration", "`/v1/models`", "and/or 3/4-inch"):
        assert not measured_figures(s), s


def test_a_planted_figure_in_a_real_doc_fails():
    docs = _hand_written_docs()
    assert not hand_copied(docs)
    for name, planted in (("docs/guide/npu.md", "On this host a step took 3.4 s."),
                          ("docs/design/measurement.md", "The int4 build kept 97.2% top-1."),
                          ("benchmarks/results/toolcalls/README.md", "| cell | 359/398 valid |")):
        broken = dict(docs, **{name: docs[name] + "\n" + planted + "\n"})
        assert hand_copied(broken) == {name: [planted]}, planted


def test_no_hand_copied_figures_in_the_docs():
    found = hand_copied(_hand_written_docs())
    assert not found, ("measured figures copied by hand (name the artifact or docs/results/ instead; "
                       "a setting says so: default, target, at most, ...):\n"
                       + "\n".join(f"{n}: {h}" for n, hits in found.items() for h in hits))


# --- links and pointers ---------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _all_docs() -> list[Path]:
    return [README, CHANGELOG, *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_resolves():
    broken = []
    for doc in _all_docs():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
            elif REPO not in path.parents and path != REPO:
                broken.append(f"{doc.relative_to(REPO)}: {target} points outside the repository")
    assert not broken, "\n".join(broken)


def test_every_code_path_named_in_the_docs_exists():
    missing = []
    for doc in _all_docs():
        for path in set(re.findall(r"`((?:src|tests|benchmarks|docs|scripts)/[\w./{},*-]+)`", doc.read_text())):
            if any(c in path for c in "{}*"):
                continue
            if not (REPO / path.rstrip("/")).exists():
                missing.append(f"{doc.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(missing)


def _repo_text_files() -> list[Path]:
    files = [README, CHANGELOG, *DOCS.rglob("*.md")]
    for top in ("src", "tests", "scripts"):
        files += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".c", ".sh", ".json"}]
    return files


def test_nothing_points_outside_the_repository_or_at_past_work_items():
    # Built from pieces so that this file does not match itself.
    outside = re.compile("design" + r"\.md ?§|\.\./" + "shared|/work/" + "shared")
    past = re.compile(r"issue[ -][0-9]|\(issue|session [0-9]|work " + "item", re.IGNORECASE)
    bad = []
    for p in _repo_text_files():
        if p == Path(__file__).resolve():
            continue
        text = p.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if outside.search(line) or past.search(line):
                bad.append(f"{p.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not bad, "\n".join(bad)


def _commands() -> set[str]:
    import argparse

    from vllm_edge.cli import build_parser

    found: set[str] = set()

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    found.add(prefix + name)
                    walk(sp, prefix + name + " ")

    walk(build_parser(), "vllm-edge ")
    return found


def test_the_cli_reference_names_every_command():
    text = (DOCS / "reference" / "cli.md").read_text()
    commands = _commands()
    leaves = {c for c in commands if not any(o.startswith(c + " ") for o in commands)}
    missing = sorted(c for c in leaves if f"`{c}" not in text)
    assert not missing, f"commands missing from docs/reference/cli.md: {missing}"
    named = set(re.findall(r"`(vllm-edge [a-z0-9-]+(?: [a-z][a-z0-9-]+)?)", text))
    stale = sorted(n for n in named if n not in commands and n.rsplit(" ", 1)[0] not in leaves)
    assert not stale, f"docs/reference/cli.md names commands that do not exist: {stale}"


def test_report_splices_the_readme_region(tmp_path, no_plots):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Mine\n\nBy hand.\n\n{claims.BEGIN}\nstale\n{claims.END}\n\nAfter.\n")
    out = results_report.report(REPO / RESULTS, tmp_path / "results.md", tmp_path / "plots", readme=readme)
    text = readme.read_text()
    assert out["readme"] == str(readme)
    assert text.startswith("# Mine\n\nBy hand.") and text.rstrip().endswith("After.")
    assert "stale" not in text and "| figure | value | flags | build | more |" in text
    # one table per host, each host once: no table holds figures of two hosts
    hosts = re.findall(r"^Host: \*\*(.+)\*\*\.$", text, re.M)
    figs = [claims.evaluate(c, REPO / RESULTS) for c, _ in claims.headline_claims()]
    assert sorted(hosts) == sorted({f.host or "host not recorded" for f in figs}), hosts
    assert not readme_mismatches(text, REPO / RESULTS, readme)
    page = tmp_path / claims.PAGE  # every claim goes beside the README it belongs to
    assert not page_mismatches(page.read_text(), REPO / RESULTS, page)


def test_only_a_repositorys_results_own_a_readme(tmp_path):
    assert results_report.default_readme(REPO / RESULTS) == README
    assert results_report.default_readme(tmp_path / "results") is None
    # a README without the markers is left alone
    plain = tmp_path / "README.md"
    plain.write_text("# no markers\n")
    assert results_report.splice_readme(REPO / RESULTS, plain) is False and plain.read_text() == "# no markers\n"


def test_the_toolcalls_table_counts_violations_apart_from_cuts_and_timeouts(tmp_path):
    cell = {"temperature": 1.0, "stream": True, "wall_s": 100.0,
            "constrained_calls": {"tool_named": 7, "tool_required": 3},
            "verdicts": {"tool_named": {"valid": 4, "length": 1, "missing": 1, "client_error:ReadTimeout": 1},
                         "tool_required": {"valid": 2, "http_500": 1}, "tool_auto": {"auto": 5}}}
    art = {"label": "L", "contract": "c", "config": {"model": "default", "serve_args": ["default", "--quant", "auto"]},
           "model_root": "/m/smollm2-135m-cpu_int4-g32", "cells": [cell], "complete": False}
    (tmp_path / "toolcalls").mkdir()
    (tmp_path / "toolcalls" / "stress_x.json").write_text(json.dumps(art))
    (tmp_path / "toolcalls" / "other.json").write_text(json.dumps(art))  # not a stress run: left out
    text = guide_tables.render_toolcalls(tmp_path, tmp_path / "serve.md")
    assert "| L | cpu_int4 g32, `--quant auto` | 1.0 | yes | 10 | 6 | 1 | 2 | 1 | 100 s |" in text
    rows = [ln for ln in text.splitlines() if "stress_x.json" in ln]
    assert len(rows) == 2 and "stopped before its last cell" in rows[1] and "other.json" not in text


def test_links_into_the_measured_page_name_its_sections():
    headings = {claims.slug(h) for h in re.findall(r"^## (.+)$", PAGE.read_text(), re.M)}
    bad = []
    for doc in _all_docs():
        for target in LINK.findall(doc.read_text()):
            path, _, anchor = target.partition("#")
            if anchor and path and (doc.parent / path).resolve() == PAGE.resolve() and anchor not in headings:
                bad.append(f"{doc.relative_to(REPO)}: {target}")
    assert not bad, "links to sections docs/results/measured.md does not have:\n" + "\n".join(bad)
