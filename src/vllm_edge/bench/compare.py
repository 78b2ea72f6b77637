"""`vllm-edge compare`: vLLM and llama.cpp side by side on matched builds.

Matched builds come from one bf16 directory: vLLM runs it as bf16 and as
``cpu_int4``; llama.cpp runs our BF16 GGUF export of the same directory and
llama.cpp's own Q4_K_M, Q4_0 and Q8_0 quantizations of that export.

One measurement core, no forks: speed and memory arms are `vllm-edge bench
speed` and the llama.cpp arm (both :func:`speed.measure`, same keys), run by
:func:`grid.run_grid` one process at a time, pinned to the same cores, rotated
over passes. Fidelity arms are `vllm-edge fidelity` (cpu_int4 against vLLM's
bf16) and :mod:`llamacpp_fidelity` (each quantized GGUF against the BF16
GGUF), also grid runs. :func:`render` turns the two grid summaries into
``docs/comparisons.md`` with one table per metric and PNG plots.

Before the measured passes every speed arm runs once ("prime", kept in
``prime.jsonl``) so vLLM's per-arm compile cache is warm and pass 0 is not a
cold start: ready time here is a warm start, as a user sees it from the second
run on.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from vllm_edge import envs
from vllm_edge.quant.groups import DEFAULT_GROUP

# (vLLM build, llama.cpp build) pairs ratios are quoted for; the first two are the goals'.
PAIRS = (("vllm-bf16", "llamacpp-BF16"), ("vllm-cpu_int4", "llamacpp-Q4_K_M"),
         ("vllm-cpu_int4", "llamacpp-Q4_0"))
GGUF_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
REF_ARM = "vllm-bf16 (reference)"
# Fidelity: each quantized build against its own engine's bf16 build.
REFERENCES = {"vllm-cpu_int4": "vllm-bf16", **{f"llamacpp-{q}": "llamacpp-BF16" for q in GGUF_QUANTS}}

DEFAULT_PASSES = 3
DEFAULT_REPS = 1
DEFAULT_BATCH = 8
DEFAULT_OUT = "benchmarks/results/compare"
DEFAULT_DOC = "docs/comparisons.md"
# Bounded fidelity: 12 prompts x 32 greedy tokens, 4 corpus chunks x 512 (1,020 scored positions).
FIDELITY_GREEDY_TOKENS = 32
FIDELITY_CHUNKS = 4
ARM_TIMEOUT_S = 900
SYNTHETIC_1B = {"hidden": 2048, "layers": 16, "vocab": 49152}

METRIC_TITLES = {"tg": "Decode, one sequence", "pp": "Prompt processing", "b": "Batch throughput",
                 "load_s": "Ready time (import + engine construction)",
                 "peak_rss_anon_mb": "Peak RssAnon over the process tree"}

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
NEW_DOC = f"""# vLLM (vllm-edge) and llama.cpp, side by side

Hand-written notes go outside the markers; `vllm-edge compare` regenerates only the part between
them (`vllm-edge compare --render-only` redraws it from the artifacts without measuring).

{BEGIN}
{END}
"""


# --- builds ------------------------------------------------------------------

def gguf_dir(key: str) -> Path:
    return envs.home() / "models" / f"{key}-gguf"


def synthetic_dir(suffix: str = "") -> Path:
    # The name `vllm-edge models synthetic` users (and issue 4's runs) give the 1B build.
    return envs.home() / "models" / f"synthetic-llama-1b{suffix}"


def builds(model: str = "default", synthetic_1b: bool = False) -> dict[str, Path]:
    """Where each matched build lives (whether or not it exists yet)."""
    from vllm_edge.models import store
    from vllm_edge.models.gguf_export import quantized_path

    if synthetic_1b:
        key, bf16, int4 = "synthetic-llama-1b", synthetic_dir(), synthetic_dir("-cpu_int4-g64")
    else:
        m = store.resolve_key(model)
        key, bf16, int4 = m.key, store.prepared_dir(m), store.quantized_dir(m, "cpu_int4", DEFAULT_GROUP)
    bf16_gguf = gguf_dir(key) / f"{key}.bf16.gguf"
    out = {"vllm-bf16": bf16, "vllm-cpu_int4": int4, "llamacpp-BF16": bf16_gguf}
    out.update({f"llamacpp-{q}": quantized_path(bf16_gguf, q) for q in GGUF_QUANTS})
    return out


def prepare(model: str = "default", synthetic_1b: bool = False, progress: bool = True) -> dict[str, Path]:
    """Create every missing build (bf16, cpu_int4, GGUF export and llama.cpp's quantizations)."""
    from vllm_edge.models import store
    from vllm_edge.models.gguf_export import export_gguf, quantize

    paths = builds(model, synthetic_1b)
    if synthetic_1b:
        from vllm_edge.models import synthetic
        from vllm_edge.quant.quantize import quantize_model

        if not (paths["vllm-bf16"] / "config.json").exists():
            synthetic.build(paths["vllm-bf16"], synthetic.Shape.derive(**SYNTHETIC_1B),
                            tokenizer_from=store.prepare("default", progress=progress), progress=progress)
        if not (paths["vllm-cpu_int4"] / "config.json").exists():
            quantize_model(paths["vllm-bf16"], paths["vllm-cpu_int4"], scheme="cpu_int4", group=64,
                           progress=progress)
    else:
        store.prepare(model, progress=progress)
        store.prepare_quantized(model, "cpu_int4", DEFAULT_GROUP, progress=progress)
    if not paths["llamacpp-BF16"].exists():
        export_gguf(paths["vllm-bf16"], paths["llamacpp-BF16"], progress=progress)
    for q in GGUF_QUANTS:
        if not paths[f"llamacpp-{q}"].exists():
            quantize(paths["llamacpp-BF16"], paths[f"llamacpp-{q}"], q)
    return paths


# --- grid specs ----------------------------------------------------------------

def speed_metrics(prompt_len: int = 512, tg_tokens: int = 128, batch: int = DEFAULT_BATCH) -> list[str]:
    from vllm_edge.bench import speed

    return [speed.tg_key(tg_tokens), speed.pp_key(prompt_len), speed.batch_key(batch), "load_s",
            "peak_rss_anon_mb"]


def build_spec(paths: dict[str, Path], *, threads: int, cores: list[int] | None = None,
               prompt_len: int = 512, tg_tokens: int = 128, batch: int = DEFAULT_BATCH,
               reps: int = DEFAULT_REPS, no_mmap: bool = True, enforce_eager: bool = False,
               python: str = "python") -> dict:
    """Speed/memory arms. llama.cpp reads its weights into anonymous memory (``--no-mmap``), as
    vLLM holds them, so peak RssAnon counts the weights on both sides."""
    common = ["--threads", str(threads), "--prompt-len", str(prompt_len), "--tg-tokens", str(tg_tokens),
              "--reps", str(reps), "--batch", str(batch)]
    arms = []
    for name, path in paths.items():
        if name.startswith("vllm-"):
            cmd = [python, "-m", "vllm_edge.cli", "bench", "speed", "--model", str(path), *common]
            if enforce_eager:
                cmd.append("--enforce-eager")
        else:
            cmd = [python, "-m", "vllm_edge.bench.llamacpp.arm", "--gguf", str(path), *common]
            if no_mmap:
                cmd.append("--no-mmap")
        arms.append({"name": name, "cmd": cmd})
    spec = {"name": "compare-speed", "threads": threads, "model": str(paths["vllm-bf16"]),
            "metrics": speed_metrics(prompt_len, tg_tokens, batch), "timeout_s": ARM_TIMEOUT_S,
            "arms": arms}
    if cores:
        spec["cores"] = cores
    return spec


FIDELITY_METRICS = ["exact_matches", "kept_fraction", "first_token_agreement", "top1_agreement",
                    "kl_mean", "kl_median", "kl_p99", "delta_logprob", "coverage", "kl_full_mean"]


def fidelity_spec(paths: dict[str, Path], *, ref_dir: Path, out_dir: Path, threads: int,
                  greedy_tokens: int = FIDELITY_GREEDY_TOKENS, chunks: int = FIDELITY_CHUNKS,
                  python: str = "python") -> dict:
    """Each engine's quantized builds against its own bf16 build, same prompts and corpus.

    vLLM runs eager here: fidelity does not depend on compilation, and two cold compiles
    would double the budget. The reference arm comes first; one pass keeps spec order."""
    from vllm_edge.bench.fidelity import engine as fidelity

    common = ["--corpus-chunks", str(chunks), "--greedy-tokens", str(greedy_tokens), "--enforce-eager"]
    arms = [{"name": REF_ARM, "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--model",
                                      str(paths["vllm-bf16"]), "--save-ref", str(ref_dir), *common]},
            {"name": "vllm-cpu_int4", "cmd": [python, "-m", "vllm_edge.cli", "fidelity", "--model",
                                              str(paths["vllm-cpu_int4"]), "--ref", str(ref_dir),
                                              "--kl-k", str(fidelity.DEFAULT_KL_K),
                                              "--out", str(out_dir / "vllm-cpu_int4.json"), *common]}]
    for q in GGUF_QUANTS:
        name = f"llamacpp-{q}"
        arms.append({"name": name, "cmd": [
            python, "-m", "vllm_edge.bench.llamacpp.fidelity", "--ref", str(paths["llamacpp-BF16"]),
            "--cand", str(paths[name]), "--tokenizer", str(paths["vllm-bf16"]),
            "--greedy-tokens", str(greedy_tokens), "--chunks", str(chunks),
            "--kl-k", str(fidelity.DEFAULT_KL_K), "--threads", str(threads),
            "--out", str(out_dir / f"{name}.json")]})
    return {"name": "compare-fidelity", "threads": threads, "model": str(paths["vllm-bf16"]),
            "metrics": FIDELITY_METRICS, "timeout_s": ARM_TIMEOUT_S,
            "arms": arms}


# --- judging pairs -------------------------------------------------------------

def pair_verdict(metric: str, vllm: dict, llama: dict) -> dict:
    """Ratio of medians (vLLM / llama.cpp) and who is ahead, judged by :func:`stats.rank`:
    overlapping [min, max] ranges, or fewer than 2 runs a side, are NOT A RANKING."""
    from vllm_edge.common import stats

    if vllm.get("median") is None or llama.get("median") is None:
        return {"ratio": None, "verdict": "not measured on both engines"}
    ratio = vllm["median"] / llama["median"] if llama["median"] else None
    r = stats.rank({"vllm": copy.deepcopy(vllm), "llama.cpp": copy.deepcopy(llama)}, metric)
    if r["direction"] is None:
        verdict = "no direction"
    elif stats.NOT_A_RANKING in r["flags"]:
        verdict = stats.NOT_A_RANKING
    else:
        verdict = f"{'vLLM' if r['leader'] == 'vllm' else 'llama.cpp'} ahead"
    return {"ratio": ratio, "verdict": verdict}


def fmt_ratio(v: dict) -> str:
    if v["ratio"] is None:
        return v["verdict"]
    return f"{v['ratio']:.2f}× ({v['verdict']})"


# --- the document ----------------------------------------------------------------

def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _link(path: Path, doc_path: Path) -> str:
    rel = os.path.relpath(path, doc_path.parent)
    return f"[`{path}`]({rel})"


def _metric_title(m: str) -> str:
    for prefix, title in METRIC_TITLES.items():
        if m == prefix or (m.startswith(prefix) and m[len(prefix):len(prefix) + 1].isdigit()):
            return f"{title} (`{m}`)"
    return f"`{m}`"


def _batch_note(records: list[dict]) -> str | None:
    """Why a llama.cpp arm has no batch number: artifacts from before the arm decoded
    batches carry the reason as a string ``batch`` field, shown in place of a ratio."""
    for r in records:
        note = (r.get("output") or {}).get("batch")
        if isinstance(note, str):
            return note
    return None


def render(out_dir: Path, doc_path: Path, display_dir: str | None = None) -> tuple[str, list[Path]]:
    """The generated markdown section and the PNGs written, from ``out_dir``'s grid summaries."""
    from vllm_edge.bench import report
    from vllm_edge.common import stats

    shown = Path(display_dir or out_dir)
    speed_path, fid_path = out_dir / "speed" / "summary.json", out_dir / "fidelity" / "summary.json"
    speed = _load(speed_path)
    if speed is None:
        raise FileNotFoundError(f"{speed_path}: no compare speed summary (run `vllm-edge compare` first)")
    fid = _load(fid_path)
    run_meta = _load(out_dir / "compare.json") or {}
    spath, fpath = shown / "speed" / "summary.json", shown / "fidelity" / "summary.json"
    records = [json.loads(x) for x in (out_dir / "speed" / "results.jsonl").read_text().splitlines()
               if x.strip()] if (out_dir / "speed" / "results.jsonl").exists() else []
    llama_arms = [a["name"] for a in speed["arms"] if a["name"].startswith("llamacpp-")]
    batch_note = _batch_note([r for r in records if r.get("arm") in llama_arms])

    prov = speed.get("provenance") or {}
    vers = prov.get("versions") or {}
    lines = [f"_Generated by `vllm-edge compare` from {_link(spath, doc_path)}"
             + (f" and {_link(fpath, doc_path)}" if fid else "") + "; edit outside the markers._", ""]
    if run_meta.get("smoke"):
        lines += ["**SMOKE RUN: proves the pipeline only. These numbers are not results.**", ""]
    lines += ["### How this was run", "",
              f"- command: `{run_meta.get('command', 'vllm-edge compare')}`"
              + (f", {run_meta['wall_s'] / 60:.1f} min wall" if run_meta.get("wall_s") else ""),
              f"- host `{prov.get('host')}`, CPU {((prov.get('cpu') or {}).get('model'))}, cores "
              f"{speed.get('cores')}, {prov.get('threads')} threads for every arm; load average at the end "
              f"{prov.get('loadavg')}",
              f"- started {run_meta.get('started')}; phases (s): {run_meta.get('phases')}",
              f"- {speed.get('passes')} passes over {len(speed['arms'])} arms, order rotated each pass, "
              f"each arm a fresh process (its own `VLLM_CACHE_ROOT`, warmed by one unmeasured run first)",
              f"- versions: vllm-cpu {vers.get('vllm-cpu')}, torch {vers.get('torch')}, llama-cpp-python "
              f"{vers.get('llama-cpp-python')}, vllm-edge {vers.get('vllm-edge')}",
              f"- busy passes (another load on the target cores): {speed.get('busy_passes') or 'none'}", ""]
    for a, c in speed["runs"].items():
        if c["failed"]:
            lines += [f"- **{a}: {c['failed']} failed run(s)**, stderr tails in {_link(shown / 'speed' / 'results.jsonl', doc_path)}"]

    # Headline: the ratios the project's goals are stated in.
    pairs = list(PAIRS)
    metrics = list(speed["metrics"])
    lines += ["", "### Headline ratios (vLLM / llama.cpp, medians)", "",
              "Above 1 is more for vLLM: better for tokens/s, worse for seconds and MB. The verdict "
              "column says who is ahead outside the noise, or NOT A RANKING when the two arms' "
              "min–max ranges overlap.", ""]
    rows = []
    for v, l in pairs:
        for m in metrics:
            arms = speed["metrics"][m]["arms"]
            if v not in arms or l not in arms:
                continue
            if arms[l].get("median") is None and m.startswith("b") and batch_note:
                rows.append([f"{v} / {l}", m, arms[v].get("median"), None, f"llama.cpp arm: {batch_note}"])
                continue
            pv = pair_verdict(m, arms[v], arms[l])
            rows.append([f"{v} / {l}", m, arms[v].get("median"), arms[l].get("median"),
                         fmt_ratio(pv)])
    fid_rows = _fidelity_rows(fid, out_dir / "fidelity", shown / "fidelity") if fid else []
    fid_by = {r["arm"]: r for r in fid_rows}
    if "vllm-cpu_int4" in fid_by and "llamacpp-Q4_K_M" in fid_by:
        a, b = fid_by["vllm-cpu_int4"], fid_by["llamacpp-Q4_K_M"]
        for k in ("kl_mean", "top1_agreement"):
            if a.get(k) is not None and b.get(k) is not None:
                ratio = a[k] / b[k] if b[k] else None
                d = stats.direction(k)
                better = (a[k] < b[k]) if d == "lower" else (a[k] > b[k])
                who = "equal" if a[k] == b[k] else ("vLLM closer to its bf16" if better
                                                    else "llama.cpp closer to its bf16")
                rows.append(["vllm-cpu_int4 / llamacpp-Q4_K_M", f"fidelity {k} (each vs own bf16)",
                             a[k], b[k], f"{ratio:.2f}× ({who})" if ratio is not None else who])
    lines += report.table(["pair", "metric", "vLLM", "llama.cpp", "ratio (verdict)"], rows)
    lines += ["", f"Source: {_link(spath, doc_path)}" + (f", {_link(fpath, doc_path)}" if fid else ""), ""]
    wins = [r for r in rows if "llama.cpp ahead" in str(r[-1]) or "llama.cpp closer" in str(r[-1])]
    if wins:
        lines += ["**Where llama.cpp wins:** " + "; ".join(f"{r[1]} ({r[0]}, {r[-1].split(' (')[0]})"
                                                          for r in wins) + ".", ""]
    else:
        lines += ["**Where llama.cpp wins:** nowhere outside the noise in this run.", ""]

    # One table per metric.
    written: list[Path] = []
    for m in metrics:
        block = speed["metrics"][m]
        lines += [f"### {_metric_title(m)}", ""]
        rows = []
        for arm, s in block["arms"].items():
            ratios = [f"vs {l.removeprefix('llamacpp-')}: {fmt_ratio(pair_verdict(m, s, block['arms'][l]))}"
                      for v, l in pairs if v == arm and l in block["arms"]]
            flags = [f for f in s.get("flags") or [] if f != "no successful run"]
            note = ("; ".join(ratios) if ratios else "–")
            if s.get("median") is None:
                note = f"not measured: {batch_note}" if arm in llama_arms and batch_note else "no successful run"
            rows.append([arm, s.get("best"), s.get("median"), s.get("min"), s.get("max"),
                         None if s.get("spread_pct") is None else f"{s['spread_pct']:.1f}%", s.get("n"),
                         " · ".join(flags) or "–", note])
        lines += report.table(["build", "best", "median", "min", "max", "spread", "n", "flags",
                                "ratio to llama.cpp (verdict)"], rows)
        rk = block.get("ranking") or {}
        if rk.get("flags"):
            lines += ["", f"Grid ranking over all arms: {' · '.join(rk['flags'])} "
                          f"(top two: {', '.join(rk.get('order', [])[:2])})."]
        elif rk.get("leader"):
            lines += ["", f"Grid ranking over all arms: {rk['leader']} leads."]
        if m == "peak_rss_anon_mb":
            lines += ["", "llama.cpp runs with `--no-mmap`, so its weights are anonymous memory as "
                          "vLLM's are; with its default mmap they would be file-backed pages outside RssAnon."]
        lines += ["", f"Source: {_link(spath, doc_path)}", ""]

    plot_arts = [report.Artifact(str(spath), {"benchmark": "speed", "build": arm,
                                              "metrics": {m: speed["metrics"][m]["arms"][arm] for m in metrics}})
                 for arm in [a["name"] for a in speed["arms"]]]
    p = out_dir / "compare_speed.png"
    report.plot_speed(plot_arts, p)
    written.append(p)
    lines += [f"![speed, ready time and memory per build]({os.path.relpath(p, doc_path.parent)})", "",
              f"Source: {_link(spath, doc_path)}", ""]

    lines += ["### Fidelity, each engine against its own bf16", ""]
    if fid_rows:
        fcmd = fid["arms"][-1]["cmd"]
        gt = fcmd[fcmd.index("--greedy-tokens") + 1] if "--greedy-tokens" in fcmd else "?"
        positions = next((r["positions"] for r in fid_rows if r.get("positions")), "?")
        kl_k = next((r["kl_k"] for r in fid_rows if r.get("kl_k")), "?")
        lines += [f"The 12 fidelity prompts (chat, long-context, tool calls), {gt} greedy tokens each; "
                  f"teacher-forced over {positions} corpus positions (pydoc topics), "
                  "the same token ids for every build of an engine. KL is over the reference's "
                  f"top-{kl_k} ids plus a tail bucket on both engines "
                  "(`KL full mean`, llama.cpp only, is the exact full-vocabulary KL). vLLM runs eager "
                  "for fidelity. One run per build: these are deterministic, not timings.", ""]
        rows = []
        for r in fid_rows:
            ratio = "–"
            if r["arm"] == "vllm-cpu_int4" and "llamacpp-Q4_K_M" in fid_by:
                ratio = fmt_ratio({"ratio": (r["kl_mean"] / fid_by["llamacpp-Q4_K_M"]["kl_mean"]
                                             if fid_by["llamacpp-Q4_K_M"].get("kl_mean") else None),
                                   "verdict": "KL vs Q4_K_M's"})
            rows.append([r["arm"], r["reference"], r.get("exact_str") or r.get("exact_matches"), r.get("kept_fraction"),
                         r.get("first_token_agreement"), r.get("top1_agreement"), r.get("kl_mean"),
                         r.get("kl_p99"), r.get("delta_logprob"), r.get("coverage"), r.get("kl_full_mean"),
                         ratio, f"`{r['artifact']}`" if r.get("artifact") else "–"])
        lines += report.table(["build", "reference", "greedy exact", "kept", "first-token top-1", "top-1",
                                "KL mean", "KL p99", "Δ log-prob", "coverage", "KL full mean",
                                "KL ratio to llama.cpp", "artifact"], rows)
        lines += ["", f"Source: {_link(fpath, doc_path)}", ""]
        arts = [report.Artifact(str(fpath), {"build": r["arm"], "teacher_forced": r}) for r in fid_rows
                if r.get("kl_mean") is not None]
        if arts:
            p = out_dir / "compare_fidelity.png"
            report.plot_fidelity(arts, p)
            written.append(p)
            lines += [f"![fidelity per build]({os.path.relpath(p, doc_path.parent)})", "",
                      f"Source: {_link(fpath, doc_path)}", ""]
        for a, c in (fid.get("runs") or {}).items():
            if c["failed"]:
                lines += [f"- **{a}: fidelity run failed**; stderr tail in "
                          f"{_link(shown / 'fidelity' / 'results.jsonl', doc_path)}", ""]
    else:
        lines += ["Not measured in this run (`--skip-fidelity`, or random weights: `--synthetic-1b`).", ""]
    return "\n".join(lines).rstrip() + "\n", written


def _fidelity_rows(fid: dict, fid_dir: Path, shown_dir: Path) -> list[dict]:
    """One row per scored build: the grid's metric medians plus the arm's full artifact
    (``<arm>.json`` beside the fidelity summary)."""
    rows = []
    for arm in [a["name"] for a in fid.get("arms", [])]:
        if arm == REF_ARM:
            continue
        row: dict[str, Any] = {"arm": arm, "reference": REFERENCES.get(arm, "–")}
        for m, block in fid["metrics"].items():
            row[m] = block["arms"].get(arm, {}).get("median")
        full = _load(fid_dir / f"{arm}.json")
        if full:
            row["artifact"] = str(shown_dir / f"{arm}.json")
            tf = full.get("teacher_forced") or {}
            row.update(positions=tf.get("positions"), kl_k=full.get("kl_k"),
                       exact_str=(full.get("greedy") or {}).get("exact_matches_str"))
        rows.append(row)
    return rows


def write_doc(out_dir: str | os.PathLike, doc: str | os.PathLike = DEFAULT_DOC) -> dict:
    from vllm_edge.bench import report
    from vllm_edge.common import atomic

    out_dir, doc_path = Path(out_dir), Path(doc)
    body, written = render(out_dir, doc_path, str(out_dir))
    old = doc_path.read_text() if doc_path.exists() else NEW_DOC
    atomic.write_text(doc_path, report.splice(old, body, BEGIN, END))
    return {"doc": str(doc_path), "plots": [str(p) for p in written]}


# --- the run ---------------------------------------------------------------------

def run(paths: dict[str, Path], *, out_dir: Path, doc: Path, passes: int = DEFAULT_PASSES,
        reps: int = DEFAULT_REPS, threads: int, cores: list[int], batch: int = DEFAULT_BATCH,
        prompt_len: int = 512, tg_tokens: int = 128, fidelity: bool = True, enforce_eager: bool = False,
        greedy_tokens: int = FIDELITY_GREEDY_TOKENS, chunks: int = FIDELITY_CHUNKS,
        allow_busy: bool = False, wait_lock: bool = False, lock_path: str | None = None,
        command: str = "vllm-edge compare", smoke: bool = False,
        log: Callable[[str], None] | None = None) -> dict:
    from tqdm import tqdm

    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.common import atomic

    t_start, started = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = grid.default_work_dir("compare")
    spec = build_spec(paths, threads=threads, cores=cores, prompt_len=prompt_len, tg_tokens=tg_tokens,
                      batch=batch, reps=reps, enforce_eager=enforce_eager)
    fspec = fidelity_spec(paths, ref_dir=work / "fidelity-ref", out_dir=out_dir / "fidelity",
                          threads=threads, greedy_tokens=greedy_tokens, chunks=chunks) if fidelity else None
    atomic.write_json(out_dir / "speed_spec.json", spec)
    if fspec:
        atomic.write_json(out_dir / "fidelity_spec.json", fspec)
    n_runs = len(spec["arms"]) * (1 + passes) + (len(fspec["arms"]) if fspec else 0)
    bar = tqdm(total=n_runs, desc="compare", unit="run", file=sys.stderr)
    say = log or bar.write

    def tick(rec: dict) -> None:
        bar.set_postfix_str(f"{rec['arm']} {'ok' if rec['ok'] else 'FAILED'} {rec['wall_s']:.0f}s")
        bar.update(1)

    phases: dict[str, float] = {}
    lock = grid.HostLock(lock_path or grid.DEFAULT_LOCK, wait=wait_lock)
    with lock:
        t0 = time.perf_counter()
        parsed = grid.load_spec(spec)
        pre = grid.contention(cores, grid.DEFAULT_BUSY_PCT)
        if pre["busy"] and not allow_busy:
            bar.close()
            raise grid.HostBusy(pre)
        atomic.write_text(out_dir / "prime.jsonl", "")
        for arm in parsed["arms"]:  # warm each arm's compile cache and the page cache; not measured
            bar.set_description(f"compare: warm-up {arm.name}")
            rec = grid.run_arm(arm, work / "cache" / grid.slugify(arm.name), cores, spec["timeout_s"])
            atomic.append_jsonl(out_dir / "prime.jsonl", [rec])
            tick(rec)
        phases["warmup_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        bar.set_description("compare: speed passes")
        summary = grid.run_grid(spec, passes, out_dir / "speed", work_dir=work, allow_busy=allow_busy,
                                lock_path=None, cores=cores, log=say, on_record=tick)
        phases["speed_s"] = round(time.perf_counter() - t0, 1)
        fsum = None
        if fspec:
            t0 = time.perf_counter()
            bar.set_description("compare: fidelity")
            fsum = grid.run_grid(fspec, 1, out_dir / "fidelity", work_dir=work, allow_busy=True,
                                 lock_path=None, cores=cores, log=say, on_record=tick)
            phases["fidelity_s"] = round(time.perf_counter() - t0, 1)
    bar.close()
    meta = {"command": command, "smoke": smoke, "started": started,
            "wall_s": round(time.perf_counter() - t_start, 1), "phases": phases, "work_dir": str(work),
            "builds": {k: str(v) for k, v in paths.items()}}
    atomic.write_json(out_dir / "compare.json", meta)
    written = write_doc(out_dir, doc)
    return {"speed": summary, "fidelity": fsum, "meta": meta, **written}


def _cmd_compare(args: argparse.Namespace) -> int:
    import shlex

    from vllm_edge.bench import speed
    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.bench.llamacpp import runner as llamacpp_runner
    from vllm_edge.common import pinning
    from vllm_edge.common.errors import UsageError

    out_dir, doc = Path(args.out), Path(args.doc)
    if args.render_only:
        try:
            res = write_doc(out_dir, doc)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(res))
        return 0
    if not llamacpp_runner.available():
        print(f"error: {llamacpp_runner.SKIP_REASON}", file=sys.stderr)
        return 2
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cpus = pinning.parse_int_list(args.cores, "--cores") or None
        cores = pinning.core_set(cpus, args.threads, allowed)
        if min(args.passes, args.reps, args.fidelity_greedy_tokens, args.fidelity_chunks) < 1:
            raise speed.SpeedArgError("--passes, --reps, --fidelity-greedy-tokens and --fidelity-chunks "
                                      "must be at least 1")
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = prepare(args.model, args.synthetic_1b)
    missing = [f"{k}: {v}" for k, v in paths.items() if not v.exists()]
    if missing:
        print("error: missing builds:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    command = "vllm-edge " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] \
        else "vllm-edge compare"
    try:
        res = run(paths, out_dir=out_dir, doc=doc, passes=args.passes, reps=args.reps, threads=len(cores),
                  cores=cores, batch=args.batch, prompt_len=args.prompt_len, tg_tokens=args.tg_tokens,
                  fidelity=not (args.skip_fidelity or args.synthetic_1b), allow_busy=args.allow_busy,
                  enforce_eager=args.enforce_eager, greedy_tokens=args.fidelity_greedy_tokens,
                  chunks=args.fidelity_chunks, lock_path=args.lock_file,
                  wait_lock=args.wait_lock, command=command, smoke=args.smoke)
    except grid.HostBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return grid.EXIT_BUSY
    except grid.LockHeld as exc:
        print(f"error: {exc}", file=sys.stderr)
        return grid.EXIT_LOCKED
    print(grid.format_summary(res["speed"]), file=sys.stderr)
    print(f"wrote {res['doc']} and {', '.join(res['plots'])}; artifacts in {out_dir}", file=sys.stderr)
    failed = {a: c["failed"] for s in (res["speed"], res["fidelity"]) if s for a, c in s["runs"].items()
              if c["failed"]}
    print(json.dumps({"doc": res["doc"], "out": str(out_dir), "wall_s": res["meta"]["wall_s"],
                      "failed_runs": failed}))
    return grid.EXIT_ARM_FAILED if failed else 0


def add_compare_commands(sub: "argparse._SubParsersAction") -> None:
    c = sub.add_parser("compare", help="vLLM vs llama.cpp on matched builds -> docs/comparisons.md",
                       description=__doc__.split("\n\n")[0] + " Default budget: under 30 minutes on 2 "
                       "cores (see docs/llama-cpp.md). Needs the [baselines] extra.")
    c.add_argument("--model", default="default", help="embedded model key, or 'default'")
    c.add_argument("--synthetic-1b", action="store_true",
                   help="a 1B random-weight Llama (hidden 2048, 16 layers): speed and memory only; "
                        "builds ~5 GB of checkpoints once; well over 30 minutes")
    c.add_argument("--passes", type=int, default=DEFAULT_PASSES, help="rotated passes (default %(default)s)")
    c.add_argument("--reps", type=int, default=DEFAULT_REPS, help="reps per arm run (default %(default)s)")
    c.add_argument("--threads", type=int, default=None, help="first N cores of the core set (default all)")
    c.add_argument("--cores", default=None, metavar="0,1", help="core set (default: our affinity)")
    c.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="concurrent sequences (default %(default)s)")
    c.add_argument("--prompt-len", type=int, default=512)
    c.add_argument("--tg-tokens", type=int, default=128)
    c.add_argument("--skip-fidelity", action="store_true")
    c.add_argument("--fidelity-greedy-tokens", type=int, default=FIDELITY_GREEDY_TOKENS,
                   help="greedy tokens per prompt, both engines (default %(default)s)")
    c.add_argument("--fidelity-chunks", type=int, default=FIDELITY_CHUNKS,
                   help="512-token corpus chunks for teacher-forced KL, both engines (default %(default)s)")
    c.add_argument("--enforce-eager", action="store_true",
                   help="vLLM speed arms without torch.compile (for smoke runs; results are compiled)")
    c.add_argument("--allow-busy", action="store_true", help="measure even if the cores are busy")
    c.add_argument("--wait-lock", action="store_true", help="queue behind a running measurement")
    c.add_argument("--lock-file", default=None, help="advisory host lock (default: the grid's)")
    c.add_argument("--smoke", action="store_true", help="mark the document as a pipeline smoke, not results")
    c.add_argument("--out", default=DEFAULT_OUT, help="artifact directory (default %(default)s)")
    c.add_argument("--doc", default=DEFAULT_DOC, help="markdown file to update (default %(default)s)")
    c.add_argument("--render-only", action="store_true", help="redraw --doc from --out without measuring")
    c.set_defaults(func=_cmd_compare)
