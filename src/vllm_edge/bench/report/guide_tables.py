"""Generated tables in the guides, read from their artifacts: the agent suite's results
(docs/guide/agent.md), the tool-call contract under load, the cost of a decoding
constraint and the security probes (docs/guide/serve.md), the
startup timeline (docs/guide/run.md) and what splitting over ranks buys
(docs/guide/parallel.md).

Each table lives between its markers; `vllm-edge report` rewrites it there, and
``tests/test_docs_numbers.py`` fails when the committed text differs from a re-render, as it
does for README's measured region. Nothing between the markers is written by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vllm_edge.bench.render import NO_HOST, flag_cell, host_line, one_host, splice
from vllm_edge.bench.report.results import grid_cell
from vllm_edge.common import atomic, provenance, stats
from vllm_edge.quant.formats.cpu_int4 import NAME as CPU_INT4
from vllm_edge.quant.formats.gptq import NAME as GPTQ

AGENT_DOC = "docs/guide/agent.md"
SERVE_DOC = "docs/guide/serve.md"
RUN_DOC = "docs/guide/run.md"
PARALLEL_DOC = "docs/guide/parallel.md"
QUANTIZE_DOC = "docs/guide/quantize.md"
FORMATS_MARKERS = ("<!-- formats-table:begin -->", "<!-- formats-table:end -->")
PARALLEL_GRID = "grid/parallel_1b/summary.json"
AGENT_MARKERS = ("<!-- agent-table:begin -->", "<!-- agent-table:end -->")
CONSTRAINED_MARKERS = ("<!-- constrained-table:begin -->", "<!-- constrained-table:end -->")
TOOLCALLS_MARKERS = ("<!-- toolcalls-table:begin -->", "<!-- toolcalls-table:end -->")
STARTUP_MARKERS = ("<!-- startup-table:begin -->", "<!-- startup-table:end -->")
GROUNDED_MARKERS = ("<!-- grounded-table:begin -->", "<!-- grounded-table:end -->")
GROUNDED_DIR = "grounded"  # one directory per host
PARALLEL_MARKERS = ("<!-- parallel-table:begin -->", "<!-- parallel-table:end -->")
SECURITY_MARKERS = ("<!-- security-table:begin -->", "<!-- security-table:end -->")
SECURITY_PROBES = "security/probes.json"
HOSTILE_MARKERS = ("<!-- security-hostile:begin -->", "<!-- security-hostile:end -->")
SECURITY_FUZZ = "security/fuzz.json"
SPEECH_DOC = "docs/guide/speech.md"
SPEECH_MARKERS = ("<!-- speech-table:begin -->", "<!-- speech-table:end -->")
MODELS_DOC = "docs/guide/models.md"
SAME_FILE_MARKERS = ("<!-- same-file-table:begin -->", "<!-- same-file-table:end -->")
SPEECH_STREAM = "speech/stream.json"
SECURITY_SOAK = "security/soak_hostile.json"


def _load(paths: list[Path], kind_key: str, kind: str | None) -> list[tuple[Path, dict]]:
    """The JSON objects among ``paths`` whose ``kind_key`` is ``kind`` (None: has the key)."""
    out = []
    for p in sorted(paths):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and (data.get(kind_key) == kind if kind is not None else kind_key in data):
            out.append((p, data))
    return out


def build_name(root: str | None) -> str:
    """The build a server ran, from its weights directory: ``cpu_int4 g32``, ``bf16``."""
    name = Path(str(root or "")).name
    if not name:
        return "?"
    # a repack of a GGUF keeps the file's codes (the default model's build)
    repack = name.endswith("-repack")
    name = name.removesuffix("-repack")
    for quant in (CPU_INT4, GPTQ):
        if f"-{quant}" in name:
            group = name.rsplit("-", 1)[-1]
            built = f"{quant} {group}" if group.startswith("g") and group[1:].isdigit() else quant
            return f"{built}, the GGUF's codes" if repack else built
    return "bf16" if name.endswith("-bf16") else name


def _link(artifact: Path, doc: Path) -> str:
    return f"[{artifact.name}]({os.path.relpath(artifact, doc.parent)})"


def _host(d: dict) -> str:
    return provenance.host(d.get("provenance")) or NO_HOST


def _flags(d: dict) -> str:
    """A row's audit flags: a dirty or unknown commit, a busy host."""
    return flag_cell(provenance.audit_flags(d.get("provenance")))


def _by_host(head: list[str], rows: list[tuple[str, list[Any]]]) -> list[str]:
    """One table per host (hosts in the order they first appear), each under its host line."""
    groups: dict[str, list[list[Any]]] = {}
    for host, row in rows:
        groups.setdefault(host, []).append(row)
    lines: list[str] = []
    for host, group in groups.items():
        one_host([host], "a guide table")
        lines += [host_line(host), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in group] + [""]
    return lines


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "–"


def _variant_spread(runs: list[dict]) -> str:
    """Pass rate per variant, lowest–highest: the spread the headline rate hides."""
    by: dict[str, list[bool]] = {}
    for r in runs:
        by.setdefault(r["variant"], []).append(bool(r["success"]))
    if len(by) < 2:
        return "–"
    rates = sorted(100 * sum(v) / len(v) for v in by.values())
    return f"{rates[0]:.0f}–{rates[-1]:.0f}% over {len(by)} variants"


def agent_rows(results_dir: Path, doc: Path) -> list[tuple[str, list[Any]]]:
    rows = []
    for path, d in _load(list((results_dir / "agent").glob("*.json")), "kind", "agent_suite"):
        cfg, s = d.get("config") or {}, d.get("summary") or {}
        root = ((d.get("provenance") or {}).get("server_model") or {}).get("root")
        mode = "constrained (`required`)" if cfg.get("tool_choice") == "required" else "unconstrained (`auto`)"
        if "answered_turns" in s:
            valid = _pct(s["valid_calls"], s["answered_turns"])
            per_turn = "–" if s.get("s_per_turn") is None else f"{s['s_per_turn']:.2f} s"
        else:  # recorded before turns were metered
            valid = per_turn = "not recorded"
        if cfg.get("engine") == "llamacpp":
            build = Path(str(cfg.get("gguf") or "?")).name
        else:
            build = build_name(root) if root else f"{path.stem.removeprefix('agent_suite_')} (from the file name)"
        rows.append((_host(d), [cfg.get("engine", "vllm"), build, mode, cfg.get("prompt", "default"),
                     _pct(s.get("passed", 0), s.get("runs", 0)), _variant_spread(d.get("runs") or []),
                     valid, per_turn, "–" if s.get("mean_steps") is None else f"{s['mean_steps']:.1f}",
                     s.get("falsely_claimed_done", "–"),
                     f"T={cfg.get('temperature')}, {cfg.get('max_steps')} steps, {cfg.get('max_tokens')} tokens",
                     _flags(d), _link(path, doc)]))
    return rows


def render_agent(results_dir: Path, doc: Path) -> str:
    rows = agent_rows(results_dir, doc)
    if not rows:
        return "No agent-suite artifacts yet (`vllm-edge agent run --serve --out benchmarks/results/agent/...`).\n"
    head = ["engine", "build", "mode", "prompt", "passed", "pass rate by variant", "valid calls / turn",
            "s / turn", "mean steps", "falsely claimed done", "settings", "flags", "artifact"]
    lines = ["_Generated by `vllm-edge report` from `benchmarks/results/agent/`; do not edit by hand._", ""]
    return "\n".join(lines + _by_host(head, rows)).rstrip("\n") + "\n"


def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f} s"


def render_constrained(results_dir: Path, doc: Path) -> str:
    arts = _load(list((results_dir / "constrained").glob("*.json")), "benchmark", "constrained")
    if not arts:
        return "No `bench constrained` artifacts yet.\n"
    head = ["engine", "build", "mode", "grammar wait: first ever", "new schema", "cached schema", "no constraint",
            "compile (new − cached)", "TTFT new / cached / none", "valid: constrained", "valid: same request free",
            "backend (setting: json_schema grammars)", "flags", "artifact"]
    lines = ["_Generated by `vllm-edge report` from `benchmarks/results/constrained/`; do not edit by hand._", "",
             "Grammar wait, vLLM: its own queue time per request (medians; one request at a time, so nothing "
             "else waits). llama.cpp (in-process): the grammar build before the prompt is evaluated, "
             "GBNF conversion and llama.cpp's parse for a new schema, the parse alone for a cached one "
             "(llama.cpp keeps no compiled grammar between requests). TTFT: time to the first token.", ""]
    rows: list[tuple[str, list[Any]]] = []
    for path, d in arts:
        so = d.get("structured_outputs") or {}
        engine = d.get("engine", "vllm")
        backend = f"{so.get('setting') or '–'}: {so.get('json_schema_backend') or '–'}"
        build = Path(str(d.get("model_root"))).name if engine == "llamacpp" else build_name(d.get("model_root"))
        wait = "grammar_s_median" if engine == "llamacpp" else "queue_s_median"
        for mode, s in (d.get("summary") or {}).items():
            k = {kind: s.get(kind) or {} for kind in ("first", "cold", "warm", "free")}
            n_con = sum(k[x].get("n", 0) for x in ("first", "cold", "warm"))
            v_con = sum(k[x].get("valid", 0) for x in ("first", "cold", "warm"))
            rows.append((_host(d), [
                engine, build, f"`{mode}`", _s(k["first"].get(wait)),
                _s(k["cold"].get(wait)), _s(k["warm"].get(wait)),
                _s(k["free"].get(wait)), _s(s.get("compile_s_estimate")),
                " / ".join(_s(k[x].get("ttft_s_median")) for x in ("cold", "warm", "free")),
                _pct(v_con, n_con), _pct(k["free"].get("valid", 0), k["free"].get("n", 0)), backend,
                _flags(d), _link(path, doc)]))
    return "\n".join(lines + _by_host(head, rows)).rstrip("\n") + "\n"


def render_toolcalls(results_dir: Path, doc: Path) -> str:
    """One row per cell of every `bench toolcalls` stress artifact (``stress_*.json``): the
    named/required contract under load."""
    arts = [(p, d) for p, d in _load(list((results_dir / "toolcalls").glob("stress_*.json")), "contract", None)
            if isinstance(d.get("cells"), list)]
    if not arts:
        return "No `bench toolcalls` artifacts yet.\n"
    head = ["run", "server", "T", "stream", "named + required sent", "valid", "cut at max_tokens",
            "missing or invalid", "unanswered (client gave up)", "wall", "flags", "artifact"]
    lines = ["_Generated by `vllm-edge report` from `benchmarks/results/toolcalls/`; do not edit by hand._", ""]
    rows: list[tuple[str, list[Any]]] = []
    for path, d in arts:
        cfg = d.get("config") or {}
        server = " ".join(a for a in (cfg.get("serve_args") or []) if a != cfg.get("model")) or "–"
        build = build_name(d.get("model_root"))
        for c in d["cells"]:
            sent = sum((c.get("constrained_calls") or {}).values())
            verdicts = c.get("verdicts") or {}
            kinds = ("tool_named", "tool_required")
            counts = [(v, n) for k in kinds for v, n in (verdicts.get(k) or {}).items()]
            valid = sum(n for v, n in counts if v == "valid")
            cut = sum(n for v, n in counts if v == "length")
            lost = sum(n for v, n in counts if v.startswith("client_error"))
            bad = sum(n for _, n in counts) - valid - cut - lost
            rows.append((_host(d), [
                d.get("label") or "–", f"{build}, `{server}`", f"{c.get('temperature')}",
                "yes" if c.get("stream") else "no", str(sent), str(valid), str(cut), str(bad), str(lost),
                f"{c.get('wall_s', 0):.0f} s", _flags(d), _link(path, doc)]))
        if d.get("complete") is False:
            rows.append((_host(d), [d.get("label") or "–", "stopped before its last cell"] + ["–"] * 8
                         + [_flags(d), _link(path, doc)]))
    return "\n".join(lines + _by_host(head, rows)).rstrip("\n") + "\n"


def _range(arm: dict, key: str, unit: str, digits: int = 1) -> str:
    vals = [r["result"].get(key) for r in arm.get("runs", []) if r["result"].get(key) is not None]
    med = arm.get(f"{key}_median")
    if med is None:
        return "–"
    spread = f" ({min(vals):.{digits}f}–{max(vals):.{digits}f})" if len(vals) > 1 else ""
    return f"{med:.{digits}f} {unit}{spread}"


def _arm_env(key: str, value: str, git: str | None) -> str:
    """An arm's variable as the guide shows it: a path on the measuring host (an arm's
    PYTHONPATH names a checkout there) is replaced by what it stands for."""
    if key == "PYTHONPATH" and value.startswith("/"):
        return f"{key}=<checkout at {git[:7]}>" if git else f"{key}=<another checkout>"
    return f"{key}=<a path>" if value.startswith("/") else f"{key}={value}"


def render_startup(results_dir: Path, doc: Path) -> str:
    """Per artifact: each arm's ready time, first token and peak memory, then its phases side
    by side (medians over passes)."""
    arts = _load(list((results_dir / "startup").glob("*.json")), "benchmark", "startup")
    if not arts:
        return "No `bench startup` artifacts yet.\n"
    lines = ["_Generated by `vllm-edge report` from `benchmarks/results/startup/`; do not edit by hand._", ""]
    for path, d in arts:
        arms = d.get("arms") or {}
        lines += [host_line(_host(d)) + f" Flags: {_flags(d)}.", "",
                  f"**{_link(path, doc)}**: {d.get('passes')} passes, arms rotated, "
                  f"`{d.get('model')}`{' ' + ' '.join(d.get('run_flags') or []) if d.get('run_flags') else ''}; "
                  f"load average {', '.join(str(round(r['loadavg'], 1)) for a in arms.values() for r in a.get('runs', [])[:1])} "
                  "at the first pass of each arm", ""]
        head = ["arm", "environment", "vllm_edge at", "ready from process start", "first token from process start",
                "peak tree RssAnon", "processes", "ready ≤ 8 s", "≤ 600 MB"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, a in arms.items():
            git = (a.get("source") or {}).get("git")
            env = ", ".join(f"`{_arm_env(k, str(v), git)}`" for k, v in (a.get("env") or {}).items()) or "–"
            first = a.get("first_token_from_start_s_median")
            met = a.get("met") or {}
            at = "–" if not git else f"`{git[:7]}`" + (" (dirty)" if git.endswith("-dirty") else "")
            lines.append("| " + " | ".join([
                label, env, at, _range(a, "ready_s", "s"), "–" if first is None else f"{first:.1f} s",
                _range(a, "peak_tree_rss_anon_mb", "MB", 0), ", ".join(map(str, a.get("peak_processes") or [])),
                "yes" if met.get("ready_s") else "no", "yes" if met.get("peak_tree_rss_anon_mb") else "no"]) + " |")
        names: list[str] = []
        for a in arms.values():
            names += [n for n in a.get("phases", {}) if n not in names]
        head = ["phase"] + [f"{label}: s (calls) · RssAnon at end" for label in arms]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for n in names:
            cells = []
            for a in arms.values():
                p = (a.get("phases") or {}).get(n)
                if not p:
                    cells.append("–")
                    continue
                calls = ",".join(map(str, p["calls"]))
                rss = "" if p.get("rss_anon_mb_median") is None else f" · {p['rss_anon_mb_median']:.0f} MB"
                cells.append(f"{p['seconds_median']:.2f}" + (f" ({calls})" if calls != "1" else "") + rss)
            lines.append("| " + " | ".join([n, *cells]) + " |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def render_parallel(results_dir: Path, doc: Path) -> str:
    """The parallel grid per arm (median ± half the spread), with each arm's tg and largest
    rank against the first arm (one rank)."""
    path = results_dir / PARALLEL_GRID
    try:
        g = json.loads(path.read_text())
    except (OSError, ValueError):
        return "No `grid/parallel_1b` run yet (`vllm-edge grid benchmarks/specs/parallel_1b.json`).\n"
    metrics = g.get("metrics") or {}
    arms = [a["name"] for a in g.get("arms") or []]
    cols = [m for m in ("tg128_tps", "pp128_tps", "peak_rss_anon_mb", "largest_rank_rss_anon_mb", "load_s")
            if m in metrics]

    def median(m: str, arm: str) -> float | None:
        return ((metrics.get(m) or {}).get("arms", {}).get(arm) or {}).get("median")

    def summary(m: str, arm: str) -> dict:
        return (metrics.get(m) or {}).get("arms", {}).get(arm) or {}

    base = arms[0] if arms else None
    head = ["arm", *cols, "tg128 vs first arm", "largest rank vs first arm"]
    lines = [f"_Generated by `vllm-edge report` from {_link(path, doc)}; do not edit by hand._", "",
             host_line(_host(g)), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in arms:
        ratios = []
        for m in ("tg128_tps", "largest_rank_rss_anon_mb"):
            a, b = median(m, arm), median(m, base) if base else None
            # the ratio's noise is the pair's own verdict, as everywhere a ratio is shown
            pair = stats.pair_flags(summary(m, arm), summary(m, base)) if arm != base and a and b else []
            ratios.append((f"{a / b:.2f}x" + (f" ({'; '.join(pair)})" if pair else "")) if a and b else "–")
        cells = [grid_cell((metrics[m].get("arms") or {}).get(arm)) for m in cols]
        lines.append("| " + " | ".join([arm, *cells, *ratios]) + " |")
    flags = []
    for m in cols:
        r = metrics[m].get("ranking") or {}
        if r.get("flags"):
            flags.append(f"`{m}`: {'; '.join(r['flags'])}")
    busy = g.get("busy_passes") or []
    flags += provenance.commit_flags(g.get("provenance"))
    lines += ["", f"{g.get('passes')} passes, arms rotated" + (f", busy passes {busy}" if busy else "")
              + (". " + "; ".join(flags) if flags else ".")]
    return "\n".join(lines) + "\n"


_GROUNDED_ROWS = (("grounded_tps", "decode tok/s, answers that copy (all)"),
                  ("summarise_tps", "… summarise"), ("extract_tps", "… extract as JSON"),
                  ("rewrite_tps", "… rewrite"), ("fix_code_tps", "… fix a function"),
                  ("quote_tps", "… quote"), ("tool_call_tps", "… tool call from the prompt"),
                  ("chat_tps", "decode tok/s, plain chat"),
                  ("batch_tps", "every prompt at once, 4 sequences: tok/s"),
                  ("accepted_share", "proposed tokens kept"), ("peak_rss_anon_mb", "peak RssAnon, MB"))


def render_grounded(results_dir: Path, doc: Path) -> str:
    """`bench grounded`: each metric per arm (median, range) and on / off with the pair's own
    verdict, one table per host; whether the greedy answers stayed the same."""
    runs = sorted((results_dir / GROUNDED_DIR).glob("*/summary.json"))
    if not runs:
        return "_No `bench grounded` run yet._\n"
    lines = ["_Generated by `vllm-edge report` from the `bench grounded` runs; do not edit by hand._", ""]
    for path in runs:
        g = json.loads(path.read_text())
        metrics = g.get("metrics") or {}
        arms = [a["name"] for a in g.get("arms") or []]
        base = arms[0]
        # the grid's own pairs (b over a), or every arm over the first for a run without them
        pairs = [(p["a"], p["b"]) for p in g.get("pairs") or []] or [(base, a) for a in arms[1:]]
        head = ["metric", *arms, *[f"{b} / {a}" for a, b in pairs]]
        lines += [host_line(_host(g)) + f" Source: {_link(path, doc)}.", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key, label in _GROUNDED_ROWS:
            block = (metrics.get(key) or {}).get("arms") or {}
            if not block:
                continue
            cells = [grid_cell(block.get(a)) for a in arms]
            ratios = []
            for a, b in pairs:
                x, y = (block.get(b) or {}).get("median"), (block.get(a) or {}).get("median")
                flags = stats.pair_flags(block[b], block[a]) if x and y else []
                ratios.append(f"{x / y:.2f}x" + (f" ({'; '.join(flags)})" if flags else "") if x and y else "–")
            lines.append("| " + " | ".join([label, *cells, *ratios]) + " |")
        same = []
        for a, d in (g.get("same_answers") or {}).items():
            if d.get("compared"):
                which = ", ".join(sorted({x["category"] for x in d.get("differ") or []}))
                same.append(f"{a}: {d['identical']} of {d['compared']} greedy answers identical to "
                            f"{base}'s" + (f" (differ: {which})" if which else ""))
        busy = g.get("busy_passes") or []
        flags = provenance.commit_flags(g.get("provenance"))
        lines += ["", f"{g.get('passes')} passes, arms rotated, each after a warm-up run"
                  + (f", busy passes {busy}" if busy else "") + ". " + "; ".join(same + flags)
                  + ("." if same or flags else ""), ""]
    return "\n".join(lines).rstrip() + "\n"


def _num(v: float | None, form: str) -> str:
    return "–" if v is None else form.format(v)


def render_same_file(results_dir: Path, doc: Path) -> str:
    """Every `compare --model FILE.gguf` run with a same-file row: vLLM's repack of the file
    scored against llama.cpp running it, and decode on the file in both engines, one table per host."""
    from vllm_edge.bench import compare
    from vllm_edge.bench.speed import tg_key

    found = sorted(results_dir.glob(f"compare_*/*/fidelity/{compare.fidelity_file(compare.SAME_ARM)}"))
    if not found:
        return "_No `compare --model FILE.gguf` run with a same-file row yet._\n"
    rows = []
    for path in found:
        fid, run = json.loads(path.read_text()), path.parent.parent
        tf, rp = fid.get("teacher_forced") or {}, fid.get("repack") or {}
        speed_path = run / "speed" / "summary.json"
        speed = json.loads(speed_path.read_text()) if speed_path.exists() else {}
        tg = ((speed.get("metrics") or {}).get(tg_key(128)) or {}).get("arms") or {}
        pair = compare.pair_verdict(tg_key(128), tg.get("vllm-cpu_int4") or {}, tg.get(compare.FILE_ARM) or {})
        rss = ((speed.get("metrics") or {}).get("peak_rss_anon_mb") or {}).get("arms") or {}
        mem = [(rss.get(a) or {}).get("median") for a in ("vllm-cpu_int4", compare.FILE_ARM)]
        # each engine against the file's exact weights (a quantized file's run since that row came)
        exact = [(json.loads(f.read_text()).get("teacher_forced") or {}) if f.exists() else {}
                 for f in (path.parent / compare.fidelity_file(a) for a in (compare.EXACT_ARM, compare.EXACT_FILE_ARM))]
        # the file the run was given: a repack is cached by the file's sha256, so its report names
        # whichever copy of those bytes built it first
        given = fid.get("reference_model") or ""
        name = Path(given).name if given.endswith(".gguf") else (rp.get("source") or run.parent.name)
        rows.append((_host(fid), [
            f"`{name}`", ", ".join(rp.get("gguf_types") or []) or "–",
            _num(rp.get("runtime_bytes_vs_gguf"), "{:.3f}x"), _num(tf.get("top1_agreement"), "{:.3f}"),
            _num(tf.get("kl_mean"), "{:.4f}"),
            (fid.get("greedy") or {}).get("exact_matches_str", "–"),
            "–" if not (t := compare.tokenizer_agreement(path.parent)) else f"{t['identical']}/{t['prompts']}",
            _pair(exact, "top1_agreement", "{:.3f}"), _pair(exact, "kl_mean", "{:.4f}"),
            compare.fmt_ratio(pair), " / ".join(_num(m, "{:.0f}") for m in mem), _flags(fid),
            _link(run / "comparisons.md", doc)]))
    head = ["file", "types in the file", "bytes read / file's", "top-1", "KL mean", "greedy exact",
            "same token ids", "vs exact weights: top-1 vLLM / llama.cpp", "KL vLLM / llama.cpp",
            "tg128 vLLM / llama.cpp", "peak RssAnon MB vLLM / llama.cpp", "flags", "page"]
    return "\n".join(["_Generated by `vllm-edge report` from the `compare --model FILE.gguf` runs; do not "
                      "edit by hand._", "", *_by_host(head, rows)]).rstrip() + "\n"


def _pair(sides: list[dict], key: str, fmt: str) -> str:
    """``a / b`` of two artifacts' ``key``, or – where the run had no such rows."""
    if not any(key in side for side in sides):
        return "–"
    return " / ".join(_num(side.get(key), fmt) for side in sides)


def render_formats(results_dir: Path, doc: Path) -> str:
    """The weight formats of the registry (quant/formats), one row each: not a measurement,
    the formats' own declarations."""
    from vllm_edge.quant import formats

    rows = formats.table()
    cols = ["format", "bits", "groups", "default group", "what", "kept losslessly"]
    lines = ["_Generated by `vllm-edge report` from the weight-format registry "
             "(`src/vllm_edge/quant/formats/`); do not edit by hand._", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f"`{r[c]}`" if c == "format" else r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(text: Any) -> str:
    return str(text if text is not None else "n/a").replace("|", "\\|")


def render_security(results_dir: Path, doc: Path) -> str:
    """The security probes: what each sends, what the branch point and this tree answered,
    and the test that holds it."""
    path = results_dir / SECURITY_PROBES
    if not path.exists():
        return "_No security probe artifact yet (scripts/security_probes.py)._\n"
    data = json.loads(path.read_text())
    before = str(data.get("before_commit") or "?")[:10]
    lines = [f"_Generated by `vllm-edge report` from {_link(path, doc)} "
             f"(`scripts/security_probes.py`; before: {before}); do not edit by hand._", "",
             # probes answer yes or no, not in time: only the commit can make them unreproducible
             host_line(_host(data)) + f" Flags: {flag_cell(provenance.commit_flags(data.get('provenance')))}.",
             "",
             "| probe | sends | before | after | held by |", "|---|---|---|---|---|"]
    for r in data["probes"]:
        test = str(r["test"]).split("::")
        lines.append(f"| {r['name']} | {_cell(r['sends'])} | {_cell(r['before'])} | "
                     f"{_cell(r['after'])} | `{test[0].rsplit('/', 1)[-1]}::{test[-1]}` |")
    return "\n".join(lines) + "\n"


def _provenance_line(data: dict) -> str:
    prov = data.get("provenance") or {}
    cpu = (prov.get("cpu") or {}).get("model") or "?"
    cores = prov.get("core_set")
    sha = str(((prov.get("build") or {}).get("vllm_edge_git")) or "?")[:10]
    return f"{cpu}, {len(cores) if isinstance(cores, list) else '?'} cores, vllm-edge {sha}"


def _rss_numbers(rss: dict) -> str:
    return (f"{rss.get('min_mb')}–{rss.get('max_mb')} MB, median {rss.get('median_mb')}, "
            f"slope {rss.get('slope_mb_per_min')} MB/min, drift (first vs last quarter) "
            f"{rss.get('drift_pct')}%")


def _rss_line(rss: dict) -> str:
    """The soak's RssAnon after warm-up: with the schema compiler kept apart (the gate kills
    it past its budget, so the whole tree saws up and down), the server without it first."""
    head = f"RssAnon after {rss['warmup_s']:g} s of warm-up ({rss['samples_after_warmup']} samples)"
    server = rss.get("without_compile_worker")
    if server is None:
        return f"Server tree {head}: {_rss_numbers(rss)}."
    worker = rss.get("compile_worker") or {}
    return (f"{head}, the server's tree without the schema compiler worker (the flatness "
            f"check): {_rss_numbers(server)}, within 5%: "
            f"{'yes' if server.get('flat_within_5pct') else 'no'}. The worker, which the gate "
            f"kills past its compile budget, started {worker.get('starts')} times, up to "
            f"{worker.get('max_mb')} MB; the whole tree with it: {_rss_numbers(rss)}.")


def render_hostile(results_dir: Path, doc: Path) -> str:
    """The body fuzz (counts by status) and the soak with hostile requests (outcomes, 5xx,
    the server tree's RssAnon over time)."""
    out = []
    fuzz = results_dir / SECURITY_FUZZ
    if fuzz.exists():
        d = json.loads(fuzz.read_text())
        counts = ", ".join(f"{k}: {v}" for k, v in d["by_status"].items())
        soak_link = (f" and {_link(results_dir / SECURITY_SOAK, doc)}"
                     if (results_dir / SECURITY_SOAK).exists() else "")
        out += [f"_Generated by `vllm-edge report` from {_link(fuzz, doc)}{soak_link}; "
                "do not edit by hand._", "",
                f"**Fuzz** (`vllm-edge bench fuzz`, seed {d['seed']}): {d['bodies']} mutated bodies "
                f"to the chat, completions, embeddings and tokenize routes of a real server with a "
                f"key, {d['concurrency']} at a time, in {d['wall_s']:g} s ({_provenance_line(d)}). "
                f"By status: {counts}. **5xx: {d['http_5xx']}**; health after: "
                f"{d['health_after']}.", ""]
    soak = results_dir / SECURITY_SOAK
    if soak.exists():
        d = json.loads(soak.read_text())
        rss = d["rss_anon"]
        cfg = d["config"]
        hostile = ", ".join(f"{k}: {v}" for k, v in d["by_class"].items())
        out += [f"**Soak with hostile requests** (`vllm-edge bench soak --hostile`): "
                f"{cfg['clients']} clients for {cfg['duration_s']:g} s, the normal mix with "
                f"oversized bodies, wrong keys, huge `n`, slow-to-compile schemas and 100,000-deep "
                f"JSON among them, and a slow body (slowloris) beside them ({_provenance_line(d)}). "
                f"{d['requests']} requests; by class: {hostile}. **5xx: {d['http_5xx']}**, "
                f"unexpected classes: {len(d['errors'])}. {_rss_line(rss)}", ""]
    return "\n".join(out) if out else "_No fuzz or hostile soak artifact yet._\n"


def render_speech(results_dir: Path, doc: Path) -> str:
    """`bench speech`: first audio with and without the ramp, real-time factors, the shares,
    memory, and the boundary error with its curve over left context."""
    path = results_dir / SPEECH_STREAM
    if not path.exists():
        return "_No `bench speech` artifact yet._\n"
    d = json.loads(path.read_text())
    sh, ramp = d["shares"], d["schedule"]["ramp"]
    synthetic = "synthetic (seeded random weights at Mimi's shapes)" if d["codec"]["synthetic"] else d["codec"]["source"]
    lines = [f"_Generated by `vllm-edge report` from {_link(path, doc)}; do not edit by hand._", "",
             host_line(_host(d)) + f" Flags: {_flags(d)}.", "",
             f"{d['passes']} passes, ramp and no ramp interleaved, medians; the codec {synthetic}, "
             f"{d['codec']['n_q']} codebooks at {d['codec']['frame_rate']:g} frames/s; the talker "
             f"{'eager' if d['enforce_eager'] else 'compiled'}; the ramp's chunks start at "
             f"{ramp['first_frames']} frame(s) and grow ×{ramp['growth']:g} to {ramp['steady_frames']}.", "",
             "| measure | value |", "|---|---|",
             f"| time to first audio, ramp | {d['ttfa_s']['ramp']:.3f} s |",
             f"| time to first audio, no ramp (every chunk {d['schedule']['no_ramp']['steady_frames']} frames) | "
             f"{d['ttfa_s']['no_ramp']:.3f} s |",
             f"| ramp / no ramp | {d['ttfa_ratio_ramp_over_no_ramp']:.2f}× |",
             f"| the talker's first frame | {d['first_frame_s']:.3f} s |",
             f"| real-time factor, one stream (ramp / no ramp) | {d['rtf']:.3f} / {d['rtf_no_ramp']:.3f} |",
             f"| real-time factor, the slowest of {len(d['rtf_4_streams_each'][0])} concurrent streams | "
             f"{d['rtf_4_streams']:.3f} |",
             f"| talker alone / codec alone, {sh['frames']} frames ({sh['audio_s']:g} s of audio) | "
             f"{sh['talker_alone_s']:.2f} s / {sh['codec_alone_s']:.2f} s "
             f"({sh['talker_share']:.0%} / {sh['codec_share']:.0%}) |",
             f"| peak RssAnon, process tree | {d['peak_tree_rss_anon_mb']:.0f} MB |",
             f"| streamed vs offline decode, stateful (max error / peak) | {d['boundary_max_abs_err']:.1e} |",
             "", "The stateless route (each chunk re-decoded after L frames of left context), against "
             "the same offline decode:", "",
             "| left context (frames) | max error / peak | SNR |", "|---|---|---|"]
    for row in d["boundary_curve_stateless"]:
        snr = "exact" if row["snr_db"] is None else f"{row['snr_db']:.1f} dB"
        lines.append(f"| {row['left_context_frames']} | {row['max_abs_err_rel_peak']:.1e} | {snr} |")
    return "\n".join(lines) + "\n"


REGIONS = ((AGENT_DOC, AGENT_MARKERS, render_agent), (SERVE_DOC, CONSTRAINED_MARKERS, render_constrained),
           (SERVE_DOC, TOOLCALLS_MARKERS, render_toolcalls),
           (RUN_DOC, STARTUP_MARKERS, render_startup), (RUN_DOC, GROUNDED_MARKERS, render_grounded), (PARALLEL_DOC, PARALLEL_MARKERS, render_parallel),
           (QUANTIZE_DOC, FORMATS_MARKERS, render_formats),
           (SERVE_DOC, SECURITY_MARKERS, render_security),
           (SERVE_DOC, HOSTILE_MARKERS, render_hostile), (SPEECH_DOC, SPEECH_MARKERS, render_speech),
           (MODELS_DOC, SAME_FILE_MARKERS, render_same_file))


def splice_guides(results_dir: str | os.PathLike, repo: str | os.PathLike) -> list[str]:
    """Rewrite each guide's generated region; the guides written (a guide without its markers
    is left alone)."""
    written = []
    for rel, (begin, end), render in REGIONS:
        path = Path(repo) / rel
        if not path.exists():
            continue
        old = path.read_text()
        if begin not in old:
            continue
        new = splice(old, render(Path(results_dir), path), begin, end)
        if new != old:
            atomic.write_text(path, new)
        written.append(str(path))
    return written
