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

from vllm_edge import atomic
from vllm_edge.harness import stats

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


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
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
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
    names = [a.build for a in arts]
    tf = [a.data["teacher_forced"] for a in arts]
    axes[0].bar(range(len(arts)), [t["kl_mean"] for t in tf],
                yerr=[[0] * len(arts), [max(0.0, t["kl_p99"] - t["kl_mean"]) for t in tf]],
                capsize=4, color="tab:red")
    axes[0].set_title("KL(ref‖cand) mean (bar to p99)", fontsize=9)
    axes[1].bar(range(len(arts)), [t["top1_agreement"] for t in tf], color="tab:green")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("teacher-forced top-1 agreement", fontsize=9)
    for ax in axes:
        ax.set_xticks(range(len(arts)), names, rotation=20, ha="right", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _footer(fig, arts)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the document ------------------------------------------------------------

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
    used = set(map(id, speed + fid + mem))

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
        lines += _table(["build", "metric", "best", "median", "min", "max", "spread", "n", "threads",
                         "flags", "artifact"], rows)
        lines += ["", _source(speed), ""]
        loads = [[a.build, a.data.get("load_s"), f"`{a.source}`"] for a in speed if a.data.get("load_s")]
        if loads:
            lines += _table(["build", "engine load (s)", "artifact"], loads) + ["", _source(speed), ""]
        if len(speed) > 1:
            lines += ["Builds measured in separate runs are not interleaved: compare them only "
                      "through a `vllm-edge grid` run, and not inside their spreads.", ""]
        p = plots_dir / PLOT_NAMES["speed"]
        plot_speed(speed, p)
        written.append(p)
        lines += [f"![speed per build]({img(p.name)})", "", _source(speed), ""]
    else:
        lines += ["No speed artifacts yet (`vllm-edge bench speed --out ...`).", ""]

    lines += ["## Memory per phase", ""]
    if mem:
        phases = sorted({p for a in mem for p in a.data["memory_phases"]})
        rows = [[a.build, *[a.data["memory_phases"].get(p) for p in phases], f"`{a.source}`"] for a in mem]
        lines += _table(["build", *[f"{p} (MB)" for p in phases], "artifact"], rows)
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
        lines += _table(["build", "reference", *[c for _, _, c in FIDELITY_COLS], "artifact"], rows)
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
        lines += _table(["summary", *[f"`{a.source}`" for a in aot], ], rows)
        lines += ["", _source(aot), ""]
        used |= set(map(id, aot))

    other = [a for a in arts if id(a) not in used]
    if other or skipped:
        lines += ["## Other artifacts", ""]
        lines += [f"- `{a.source}`: {a.kind}, not summarised here" for a in other]
        lines += [f"- skipped {s}" for s in skipped]
        lines += [""]
    return "\n".join(lines).rstrip() + "\n", written


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
