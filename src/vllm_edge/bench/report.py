"""`vllm-edge report`: benchmarks/results/*.json|jsonl -> docs/results.md + PNG plots.

Only the text between the report markers is generated; anything written by
hand outside them survives a regeneration. Every table and figure is followed
by a ``Source:`` line naming the artifact files it was drawn from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_edge.common import atomic, stats

BEGIN = "<!-- report:begin -->"
END = "<!-- report:end -->"
DEFAULT_RESULTS = "benchmarks/results"
DEFAULT_DOC = "docs/results.md"
PLOT_NAMES = {"speed": "report_speed.png", "memory": "report_memory.png", "fidelity": "report_fidelity.png"}

NEW_DOC = f"""# Results

Hand-written notes go outside the markers; `vllm-edge report` regenerates only the part between them.

{BEGIN}
{END}
"""

FIDELITY_COLS = [("greedy", "exact_matches_str", "exact"), ("greedy", "kept_fraction", "kept"),
                 ("greedy", "first_token_agreement", "first-token top-1"),
                 ("teacher_forced", "top1_agreement", "top-1"), ("teacher_forced", "kl_mean", "KL mean"),
                 ("teacher_forced", "kl_median", "KL median"), ("teacher_forced", "kl_p99", "KL p99"),
                 ("teacher_forced", "delta_logprob", "Δ log-prob"), ("teacher_forced", "coverage", "coverage")]


@dataclass
class Artifact:
    source: str          # how the docs name it, e.g. benchmarks/results/speed.json or ...jsonl:3
    data: dict

    @property
    def kind(self) -> str:
        return str(self.data.get("benchmark") or "other")

    @property
    def build(self) -> str:
        return str(self.data.get("build") or Path(self.source.split(":")[0]).stem)


def load_artifacts(results_dir: str | os.PathLike, display: str | None = None) -> tuple[list[Artifact], list[str]]:
    """Artifacts in file-name order, plus ``file: reason`` for files that could not be read."""
    rdir = Path(results_dir)
    shown = (display or str(results_dir)).rstrip("/")
    arts: list[Artifact] = []
    skipped: list[str] = []
    files = sorted(p for p in rdir.glob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    for f in files:
        name = f"{shown}/{f.name}"
        try:
            if f.suffix == ".json":
                obj = json.loads(f.read_text())
                items = [(name, obj)]
            else:
                items = [(f"{name}:{i + 1}", json.loads(line))
                         for i, line in enumerate(f.read_text().splitlines()) if line.strip()]
        except (OSError, json.JSONDecodeError) as exc:
            skipped.append(f"{name}: {exc}")
            continue
        for src, obj in items:
            if isinstance(obj, dict):
                arts.append(Artifact(src, obj))
            else:
                skipped.append(f"{src}: not a JSON object")
    return arts, skipped


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return out


def _source(arts: list[Artifact]) -> str:
    names = sorted({a.source.split(":")[0] for a in arts})
    return "Source: " + ", ".join(f"`{n}`" for n in names)


def _speed_metrics(a: Artifact) -> dict[str, dict]:
    m = a.data.get("metrics") or {}
    if not m and a.data.get("runs"):
        m = {k: stats.summarize(v, k) for k, v in a.data["runs"].items()}
    return {k: s for k, s in m.items() if isinstance(s, dict) and s.get("median") is not None}


def _model_name(a: Artifact) -> str:
    return Path(str(a.data.get("model") or "")).name


def _quant(a: Artifact) -> str | None:
    """The quantization method of the checkpoint an artifact ran, None for a float build."""
    acc = a.data.get("bytes_per_token")
    if isinstance(acc, dict) and "quant_method" in acc:
        return acc["quant_method"]
    qcfg = ((a.data.get("provenance") or {}).get("model") or {}).get("quantization_config")
    return str(qcfg.get("quant_method")).lower() if isinstance(qcfg, dict) else None


def _is_vllm(a: Artifact) -> bool:
    return not isinstance(a.data.get("engine"), str)  # llama.cpp's arm names itself there


def _is_default_model(a: Artifact) -> bool:
    from vllm_edge.models import store

    name = _model_name(a)
    return any(name == f"{k}-bf16" or name.startswith(f"{k}-") for k in store.MODELS)


def _tg_key(metrics: dict) -> str | None:
    keys = sorted(k for k in metrics if k.startswith("tg") and k.endswith("_tps") and "_at_d" not in k)
    return keys[0] if keys else None


def _fidelity_for(model_name: str, fid: list[Artifact]) -> Artifact | None:
    """The latest fidelity artifact of this checkpoint (by provenance timestamp)."""
    match = [a for a in fid if _model_name(a) == model_name]
    return max(match, key=lambda a: str((a.data.get("provenance") or {}).get("timestamp") or "")) if match else None


def _pct(v: Any) -> str:
    return "–" if v is None else f"{v:.1f}%"


def _mb(v: Any) -> str:
    return "–" if v is None else f"{v / 1e6:.1f}"


def _cell(s: dict | None) -> str:
    if not s:
        return "–"
    sp = "–" if s.get("spread_pct") is None else f"{s['spread_pct']:.1f}%"
    return f"{s['median']:.4g} ({s['min']:.4g}–{s['max']:.4g}, spread {sp}, n={s['n']})"


# --- plots -------------------------------------------------------------------

def _plt():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("the report needs matplotlib: pip install 'vllm-edge[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _footer(fig: Any, arts: list[Artifact]) -> None:
    fig.text(0.01, 0.005, _source(arts).replace("`", ""), fontsize=7, ha="left", va="bottom")


def unit(metric: str) -> str:
    m = metric.lower()
    return ("tokens/s" if m.endswith("_tps") else "MB" if m.endswith("_mb") else "s" if m.endswith("_s")
            else "")


def plot_speed(arts: list[Artifact], path: Path) -> None:
    """One panel per metric; a bar per build at the median, error bars min–max."""
    plt = _plt()
    metrics = sorted({k for a in arts for k in _speed_metrics(a)})
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(4.0, 3.2 * len(metrics)), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        rows = [(a.build, _speed_metrics(a)[m]) for a in arts if m in _speed_metrics(a)]
        med = [s["median"] for _, s in rows]
        err = [[s["median"] - s["min"] for _, s in rows], [s["max"] - s["median"] for _, s in rows]]
        ax.bar(range(len(rows)), med, yerr=err, capsize=4, color="tab:blue")
        ax.set_xticks(range(len(rows)), [b for b, _ in rows], rotation=20, ha="right", fontsize=7)
        ax.set_title(f"{m}\n(median, bars min–max)", fontsize=9)
        ax.set_ylabel(unit(m))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _footer(fig, arts)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(arts: list[Artifact], path: Path) -> None:
    plt = _plt()
    phases = sorted({p for a in arts for p in a.data["memory_phases"]})
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(phases) * max(1, len(arts))), 3.8))
    width = 0.8 / max(1, len(arts))
    for i, a in enumerate(arts):
        vals = [a.data["memory_phases"].get(p) or 0 for p in phases]
        ax.bar([j + i * width for j in range(len(phases))], vals, width, label=a.build)
    ax.set_xticks([j + width * (len(arts) - 1) / 2 for j in range(len(phases))], phases, fontsize=7)
    ax.set_ylabel("RssAnon over the process tree (MB)")
    ax.set_title("memory per phase", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _footer(fig, arts)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fidelity(arts: list[Artifact], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    names = [a.build for a in arts]
    tf = [a.data["teacher_forced"] for a in arts]
    gr = [a.data.get("greedy") or {} for a in arts]
    axes[0].bar(range(len(arts)), [t["kl_mean"] for t in tf],
                yerr=[[0] * len(arts), [max(0.0, t["kl_p99"] - t["kl_mean"]) for t in tf]],
                capsize=4, color="tab:red")
    axes[0].set_title("KL(ref‖cand) mean (bar to p99)", fontsize=9)
    axes[1].bar(range(len(arts)), [t["top1_agreement"] for t in tf], color="tab:green")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("teacher-forced top-1 agreement", fontsize=9)
    x = list(range(len(arts)))
    w = 0.4
    axes[2].bar([i - w / 2 for i in x], [g.get("exact_matches", 0) / max(1, g.get("prompts") or 1) for g in gr],
                w, label="exact matches", color="tab:purple")
    axes[2].bar([i + w / 2 for i in x], [g.get("kept_fraction") or 0 for g in gr], w,
                label="kept before divergence", color="tab:orange")
    axes[2].set_ylim(0, 1.3)
    axes[2].set_title("greedy: exact prompts / tokens kept", fontsize=9)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(range(len(arts)), names, rotation=20, ha="right", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _footer(fig, arts)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the document ------------------------------------------------------------

def _headline(speed: list[Artifact], fid: list[Artifact]) -> list[str]:
    """The default model's bf16 build against its fastest 4-bit build (vLLM only: each
    engine's quantized build is compared with its own bf16 build)."""
    lines = ["## Default model: bf16 against the best 4-bit path", ""]
    mine = [a for a in speed if _is_vllm(a) and _is_default_model(a)]
    bf16 = [a for a in mine if _quant(a) is None]
    four = [a for a in mine if _quant(a) in ("cpu_int4", "gptq", "awq")]
    if not bf16 or not four:
        missing = " and ".join(w for w, have in (("bf16", bf16), ("4-bit", four)) if not have)
        return lines + [f"No {missing} `bench speed` artifact of the default model yet "
                        "(`vllm-edge bench speed [--quant cpu_int4] --out ...`).", ""]

    def tg(a: Artifact) -> float:
        k = _tg_key(_speed_metrics(a))
        return _speed_metrics(a)[k]["median"] if k else float("-inf")

    base = max(bf16, key=lambda a: str((a.data.get("provenance") or {}).get("timestamp") or ""))
    best = max(four, key=tg)
    mb, mq = _speed_metrics(base), _speed_metrics(best)
    rows = []
    for k in [k for k in mb if k in mq]:
        r = stats.rank({"bf16": dict(mb[k], flags=list(mb[k].get("flags") or [])),
                        "4-bit": dict(mq[k], flags=list(mq[k].get("flags") or []))}, k)
        ratio = mq[k]["median"] / mb[k]["median"] if mb[k]["median"] else None
        verdict = [f"{r['leader']} ahead"] if r.get("leader") else list(r.get("flags") or [])
        verdict += [f"{f} ({who})" for who, m in (("bf16", mb[k]), ("4-bit", mq[k]))
                    for f in (m.get("flags") or []) if f != stats.NOT_A_RANKING]
        verdict = "; ".join(verdict) or "–"
        rows.append([k, _cell(mb[k]), _cell(mq[k]), None if ratio is None else f"{ratio:.2f}×", verdict])
    tb, tq = base.data.get("traffic") or {}, best.data.get("traffic") or {}
    for k in [k for k in tb if k in tq]:
        for field, label, fmt in (("bytes_per_token", "MB/token", _mb),
                                  ("gb_per_s_effective", "GB/s effective", lambda v: _fmt(v)),
                                  ("pct_of_ceiling", "% of ceiling", _pct)):
            a_, b_ = tb[k].get(field), tq[k].get(field)
            ratio = f"{b_ / a_:.2f}×" if a_ and b_ is not None else None
            rows.append([f"{k}: {label}", fmt(a_), fmt(b_), ratio, "derived"])
    fb = _fidelity_for(_model_name(best), fid)
    if fb:
        g, t = fb.data.get("greedy") or {}, fb.data["teacher_forced"]
        rows.append(["fidelity vs bf16: greedy exact", "reference", g.get("exact_matches_str"), None,
                     f"`{fb.source}`"])
        rows.append(["fidelity vs bf16: top-1 / KL mean / KL p99", "reference",
                     f"{t['top1_agreement']:.4f} / {t['kl_mean']:.4g} / {t['kl_p99']:.4g}", None,
                     f"`{fb.source}`"])
    header = ["metric", f"bf16: {base.build}", f"best 4-bit: {best.build}", "4-bit / bf16", "judgement"]
    lines += ["Median (min–max, spread, n). The best 4-bit path is the 4-bit build with the "
              "highest tg median" + (f" among {len(four)}" if len(four) > 1 else "") + "; "
              "`NOT A RANKING` where the ranges overlap or a build has one pass. Separate "
              "`bench speed` runs are not interleaved: on a shared host quote the ratio only "
              "from a quiet-host run.", ""]
    lines += table(header, rows)
    srcs = [base, best] + ([fb] if fb else [])
    lines += ["", _source(srcs), ""]
    if not fb:
        lines += [f"No fidelity artifact for `{_model_name(best)}` yet "
                  "(`vllm-edge fidelity --ref DIR --quant cpu_int4 --out ...`).", ""]
    return lines


def render(arts: list[Artifact], skipped: list[str], plots_dir: Path, doc_path: Path,
           results_display: str) -> tuple[str, list[Path]]:
    """The generated markdown section and the PNG files written."""
    def img(name: str) -> str:
        return os.path.relpath(plots_dir / name, doc_path.parent)

    lines = [f"_Generated by `vllm-edge report` from `{results_display}/`; edit outside the markers._", ""]
    written: list[Path] = []
    speed = [a for a in arts if a.kind == "speed" and _speed_metrics(a)]
    fid = [a for a in arts if a.kind == "fidelity" and isinstance(a.data.get("teacher_forced"), dict)]
    mem = [a for a in arts if isinstance(a.data.get("memory_phases"), dict) and a.data["memory_phases"]]
    bws = [a for a in arts if a.kind == "bandwidth" and isinstance(a.data.get("metrics"), dict)]
    used = set(map(id, speed + fid + mem + bws))

    lines += _headline(speed, fid)

    lines += ["## Speed", ""]
    if speed:
        rows = []
        for a in speed:
            cfg = a.data.get("config") or {}
            threads = (a.data.get("pinning") or {}).get("threads") or cfg.get("threads")
            for k, s in _speed_metrics(a).items():
                rows.append([a.build, k, s.get("best"), s["median"], s.get("min"), s.get("max"),
                             None if s.get("spread_pct") is None else f"{s['spread_pct']:.1f}%",
                             s.get("n"), threads, "; ".join(s.get("flags") or []) or "–",
                             f"`{a.source}`"])
        lines += table(["build", "metric", "best", "median", "min", "max", "spread", "n", "threads",
                         "flags", "artifact"], rows)
        lines += ["", _source(speed), ""]
        loads = [[a.build, a.data.get("load_s"), f"`{a.source}`"] for a in speed if a.data.get("load_s")]
        if loads:
            lines += table(["build", "engine load (s)", "artifact"], loads) + ["", _source(speed), ""]
        if len(speed) > 1:
            lines += ["Builds measured in separate runs are not interleaved: compare them only "
                      "through a `vllm-edge grid` run, and not inside their spreads.", ""]
        p = plots_dir / PLOT_NAMES["speed"]
        plot_speed(speed, p)
        written.append(p)
        lines += [f"![speed per build]({img(p.name)})", "", _source(speed), ""]
    else:
        lines += ["No speed artifacts yet (`vllm-edge bench speed --out ...`).", ""]

    traffic = [a for a in speed if a.data.get("traffic")]
    if traffic:
        lines += ["### Bytes per decoded token", ""]
        rows = []
        for a in traffic:
            acc = a.data.get("bytes_per_token") or {}
            bpw = (acc.get("bits_per_weight") or {}).get("linears_and_head")
            ceiling = (a.data.get("bandwidth") or {}).get("ceiling_gb_per_s")
            for k, t in a.data["traffic"].items():
                rows.append([a.build, k, _mb(t["weight_bytes"]), _mb(t["kv_bytes"]), t["context_tokens"],
                             _mb(t["bytes_per_token"]), bpw, "yes" if acc.get("head_tied") else "no",
                             t["gb_per_s_effective"], ceiling, _pct(t.get("pct_of_ceiling")), f"`{a.source}`"])
        lines += ["Weights at the bytes the engine reads (the head in full, tied or not; one "
                  "embedding row), plus the KV cache at the mean context of the timed steps; "
                  "see docs/methodology.md.", ""]
        lines += table(["build", "metric", "weights (MB)", "KV (MB)", "context", "bytes/token (MB)",
                         "bits/weight (linears+head)", "tied head", "GB/s (median)", "ceiling GB/s",
                         "% of ceiling", "artifact"], rows)
        lines += ["", _source(traffic), ""]

    lines += ["## Read bandwidth", ""]
    if bws:
        rows = []
        for a in bws:
            m = a.data["metrics"].get("read_gb_per_s") or {}
            rows.append([a.build, ",".join(map(str, a.data.get("cores") or [])),
                         f"{(a.data.get('buffer_bytes') or 0) / 2**20:.0f} MiB",
                         a.data.get("buffer_over_llc"), a.data.get("ceiling_gb_per_s") or "none (in cache)",
                         m.get("median"), None if m.get("spread_pct") is None else f"{m['spread_pct']:.1f}%",
                         m.get("n"), "; ".join(m.get("flags") or []) or "–", f"`{a.source}`"])
        lines += table(["build", "cores", "buffer", "× LLC", "ceiling GB/s (best)", "median GB/s",
                         "spread", "n", "flags", "artifact"], rows)
        lines += ["", _source(bws), ""]
    else:
        lines += ["No bandwidth artifacts yet (`vllm-edge bandwidth`).", ""]

    lines += ["## Memory per phase", ""]
    if mem:
        phases = sorted({p for a in mem for p in a.data["memory_phases"]})
        rows = [[a.build, *[a.data["memory_phases"].get(p) for p in phases], f"`{a.source}`"] for a in mem]
        lines += table(["build", *[f"{p} (MB)" for p in phases], "artifact"], rows)
        lines += ["", "RssAnon summed over the process tree (engine core and workers included).", "",
                  _source(mem), ""]
        p = plots_dir / PLOT_NAMES["memory"]
        plot_memory(mem, p)
        written.append(p)
        lines += [f"![memory per phase]({img(p.name)})", "", _source(mem), ""]
    else:
        lines += ["No artifacts with `memory_phases` yet.", ""]

    lines += ["## Fidelity", ""]
    if fid:
        rows = [[a.build, a.data.get("reference_build") or "–",
                 *[a.data.get(part, {}).get(key) for part, key, _ in FIDELITY_COLS], f"`{a.source}`"]
                for a in fid]
        lines += table(["build", "reference", *[c for _, _, c in FIDELITY_COLS], "artifact"], rows)
        lines += ["", _source(fid), ""]
        p = plots_dir / PLOT_NAMES["fidelity"]
        plot_fidelity(fid, p)
        written.append(p)
        lines += [f"![fidelity per build]({img(p.name)})", "", _source(fid), ""]
    else:
        lines += ["No fidelity artifacts yet (`vllm-edge fidelity --ref DIR --out ...`).", ""]

    aot = [a for a in arts if a.kind == "aot-cache" and isinstance(a.data.get("summary"), dict)]
    if aot:
        lines += ["## Compile cache (AOT) starts", ""]
        keys = [k for k in aot[0].data["summary"] if not isinstance(aot[0].data["summary"][k], (dict, list))]
        rows = [[k, *[a.data["summary"].get(k) for a in aot]] for k in keys]
        lines += table(["summary", *[f"`{a.source}`" for a in aot], ], rows)
        lines += ["", _source(aot), ""]
        used |= set(map(id, aot))

    lines += grid_sections(Path(results_display), results_display)

    other = [a for a in arts if id(a) not in used]
    if other or skipped:
        lines += ["## Other artifacts", ""]
        lines += [f"- `{a.source}`: {a.kind}, not summarised here" for a in other]
        lines += [f"- skipped {s}" for s in skipped]
        lines += [""]
    return "\n".join(lines).rstrip() + "\n", written


def _grid_cell(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "–"
    spread = "" if s.get("spread_pct") is None else f" ±{s['spread_pct'] / 2:.0f}%"
    return f"{_fmt(s['median'])}{spread}"


def grid_sections(results_dir: Path, results_display: str) -> list[str]:
    """One table per grid run under ``grid/``: median (± half the spread) per arm and metric,
    flags from the grid's own judgement, and each arm's delta against the spec's baseline arm."""
    lines: list[str] = []
    summaries = sorted((results_dir / "grid").glob("*/summary.json"))
    if not summaries:
        return lines
    lines += ["## Grid runs", "",
              "Medians over rotated passes, ± half the min–max spread. `NOT A RANKING`: the top "
              "two arms overlap inside their spreads, so no order is claimed.", ""]
    for f in summaries:
        try:
            g = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            lines += [f"- skipped `{f}`: {exc}", ""]
            continue
        metrics = g.get("metrics") or {}
        arms = [a["name"] for a in g.get("arms") or []]
        if not metrics or not arms:
            continue
        src = f"{results_display}/grid/{f.parent.name}/summary.json"
        busy = g.get("busy_passes") or []
        lines += [f"### `grid/{f.parent.name}` (spec `{g.get('name')}`)", ""]
        if g.get("description"):
            lines += [g["description"], ""]
        names = list(metrics)
        rows = [[arm, *[_grid_cell(metrics[m]["arms"].get(arm)) for m in names]] for arm in arms]
        lines += table(["arm", *names], rows)
        flags = []
        for m in names:
            r = metrics[m].get("ranking") or {}
            tag = "; ".join(r.get("flags") or []) or (f"leader: {r['leader']}" if r.get("leader") else "")
            if tag:
                flags.append(f"`{m}`: {tag}")
        lines += ["", f"{g.get('passes')} passes" + (f", busy passes {busy}" if busy else "")
                  + (" (after a warm-up pass)" if g.get("warmup") else "") + ". " + "; ".join(flags), ""]
        lines += [f"Source: `{src}`", ""]
    return lines


def splice(doc: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    """Replace the text between the markers; append the markers if there are none."""
    b, e = doc.find(begin), doc.find(end)
    if b == -1 and e == -1:
        return doc.rstrip("\n") + f"\n\n{begin}\n{body}{end}\n"
    if b == -1 or e == -1 or e < b:
        raise ValueError(f"unbalanced report markers: need {begin} before {end}")
    return doc[:b + len(begin)] + "\n" + body + doc[e:]


def report(results_dir: str | os.PathLike = DEFAULT_RESULTS, doc: str | os.PathLike = DEFAULT_DOC,
           plots_dir: str | os.PathLike | None = None) -> dict:
    rdir = Path(results_dir)
    doc_path = Path(doc)
    pdir = Path(plots_dir) if plots_dir else rdir
    pdir.mkdir(parents=True, exist_ok=True)
    arts, skipped = load_artifacts(rdir, str(results_dir))
    body, written = render(arts, skipped, pdir, doc_path, str(results_dir).rstrip("/"))
    old = doc_path.read_text() if doc_path.exists() else NEW_DOC
    atomic.write_text(doc_path, splice(old, body))
    return {"doc": str(doc_path), "plots": [str(p) for p in written], "artifacts": len(arts),
            "skipped": skipped}


def _cmd_report(args: argparse.Namespace) -> int:
    try:
        out = report(args.results, args.doc, args.plots_dir)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out['doc']} from {out['artifacts']} artifact record(s); plots: "
          + (", ".join(out["plots"]) or "none"))
    for s in out["skipped"]:
        print(f"skipped {s}", file=sys.stderr)
    return 0


def add_report_commands(sub: "argparse._SubParsersAction") -> None:
    r = sub.add_parser("report", help="regenerate docs/results.md and its plots from benchmarks/results/",
                       description="Reads every *.json and *.jsonl in --results and rewrites the part "
                                   f"of --doc between {BEGIN} and {END}.")
    r.add_argument("--results", default=DEFAULT_RESULTS, help="artifact directory (default %(default)s)")
    r.add_argument("--doc", default=DEFAULT_DOC, help="markdown file to update (default %(default)s)")
    r.add_argument("--plots-dir", default=None, help="where PNGs go (default: the results directory)")
    r.set_defaults(func=_cmd_report)
