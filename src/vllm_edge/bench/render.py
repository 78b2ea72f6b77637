"""Result artifacts as the docs show them: the artifact record, markdown tables, splicing a
generated section between its markers, and the plots.

Shared by the doc generators (:mod:`vllm_edge.bench.report`) and by the measurements that
write their own page when they finish (``vllm-edge compare``), so it sits with the
measurements and imports no doc generator.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_edge.common import errors, provenance, stats

NO_HOST = "host not recorded"


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

    @property
    def prov(self) -> dict:
        return self.data.get("provenance") or {}

    @property
    def host(self) -> str:
        return provenance.host(self.prov) or NO_HOST

    @property
    def grid(self) -> bool:
        return isinstance(self.data.get("arms"), list)

    def flags(self) -> list[str]:
        """What a row drawn from this artifact must say about its commit and load."""
        return provenance.audit_flags(self.prov, grid=self.grid)


class MixedHosts(errors.EdgeError, ValueError):
    """One table, or one ratio, drawn from more than one machine: its figures do not compare."""


def one_host(hosts: list[str | None], what: str) -> str:
    """The one host ``hosts`` name; :class:`MixedHosts` when they name two."""
    named = sorted({h or NO_HOST for h in hosts})
    if len(named) > 1:
        raise MixedHosts(f"{what} mixes hosts: {' and '.join(named)}; give each host its own table")
    return named[0] if named else NO_HOST


def by_host(arts: list[Artifact]) -> list[tuple[str, list[Artifact]]]:
    """``arts`` split by host, hosts in the order they first appear: one table each."""
    groups: dict[str, list[Artifact]] = {}
    for a in arts:
        groups.setdefault(a.host, []).append(a)
    return list(groups.items())


def host_line(host: str) -> str:
    """The line that names a table's host, above it."""
    return f"Host: **{host}**."


def host_table(host: str, header: list[str], rows: list[list[Any]], row_hosts: list[str]) -> list[str]:
    """A table under the line naming its host; refuses a row measured on another host."""
    one_host([host, *row_hosts], f"the table {header}")
    return [host_line(host), "", *table(header, rows)]


def flag_cell(*groups: list[str] | None) -> str:
    """A flags cell: every flag once, in order; – when there is none."""
    out: list[str] = []
    for g in groups:
        out += [f for f in g or [] if f not in out]
    return "; ".join(out) or "–"


HOST_FOLDERS = ("bandwidth", "scale_prefetch")


def load_artifacts(results_dir: str | os.PathLike, display: str | None = None) -> tuple[list[Artifact], list[str]]:
    """Artifacts in file-name order, plus ``file: reason`` for files that could not be read."""
    rdir = Path(results_dir)
    shown = (display or str(results_dir)).rstrip("/")
    arts: list[Artifact] = []
    skipped: list[str] = []
    files = sorted(p for p in rdir.glob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    # benches that keep one file per host in a folder of their own
    files += sorted(p for d in HOST_FOLDERS for p in (rdir / d).glob("*.json") if p.is_file())
    for f in files:
        name = f"{shown}/{f.relative_to(rdir).as_posix()}"
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


def fmt(v: Any, digits: int = 4) -> str:
    """A table cell: – for None, floats to ``digits`` significant digits."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table, one line per list item."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return out


def source_line(arts: list[Artifact]) -> str:
    """The ``Source:`` line naming the files ``arts`` came from."""
    names = sorted({a.source.split(":")[0] for a in arts})
    return "Source: " + ", ".join(f"`{n}`" for n in names)


def speed_metrics(a: Artifact) -> dict[str, dict]:
    """A speed artifact's metrics with a median (summarised from raw ``runs`` if need be)."""
    m = a.data.get("metrics") or {}
    if not m and a.data.get("runs"):
        m = {k: stats.summarize(v, k) for k, v in a.data["runs"].items()}
    return {k: s for k, s in m.items() if isinstance(s, dict) and s.get("median") is not None}


def splice(doc: str, body: str, begin: str, end: str) -> str:
    """Replace the text between the markers; append the markers if there are none."""
    b, e = doc.find(begin), doc.find(end)
    if b == -1 and e == -1:
        return doc.rstrip("\n") + f"\n\n{begin}\n{body}{end}\n"
    if b == -1 or e == -1 or e < b:
        raise ValueError(f"unbalanced report markers: need {begin} before {end}")
    return doc[:b + len(begin)] + "\n" + body + doc[e:]


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
    fig.text(0.01, 0.005, source_line(arts).replace("`", ""), fontsize=7, ha="left", va="bottom")


def unit(metric: str) -> str:
    m = metric.lower()
    return ("tokens/s" if m.endswith("_tps") else "MB" if m.endswith("_mb") else "s" if m.endswith("_s")
            else "")


def plot_speed(arts: list[Artifact], path: Path) -> None:
    """One panel per metric; a bar per build at the median, error bars min–max."""
    plt = _plt()
    metrics = sorted({k for a in arts for k in speed_metrics(a)})
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(4.0, 3.2 * len(metrics)), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        rows = [(a.build, speed_metrics(a)[m]) for a in arts if m in speed_metrics(a)]
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
