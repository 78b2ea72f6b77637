"""Judgement over repeated measurements: best, median, spread and the flags
that stop a reader from ranking inside the noise (docs/design/measurement.md, "Repetition and judgement").

Direction comes from the metric name so that no caller can forget it:

* higher is better: names ending ``_tps``, ``_per_s``, ``agreement``, ``matches``;
* lower is better: memory (``_mb``, ``_kb``, ``_gb``, ``_bytes``), time
  (``_s``, ``_ms``, ``_us``, ``_ns``) and KL (a ``kl`` or ``kld`` name part);
* anything else has no direction: it is summarised but never ranked or gated.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Iterable, Literal

Direction = Literal["higher", "lower"]

HIGHER_SUFFIXES = ("_tps", "_per_s", "agreement", "matches")
# Throughput swings ~30% on a shared host; the gate reports these but never fails on them.
THROUGHPUT_SUFFIXES = ("_tps", "_per_s")
LOWER_SUFFIXES = ("_mb", "_kb", "_gb", "_bytes", "_s", "_ms", "_us", "_ns")
LOWER_PARTS = ("kl", "kld")

DEFAULT_NOISY_PCT = 10.0

NOISY = "NOISY"
SINGLE_PASS = "single pass — not a result"
NOT_A_RANKING = "NOT A RANKING"


def direction(metric: str) -> Direction | None:
    name = metric.lower().rsplit(".", 1)[-1]  # flattened nested keys: judge the leaf
    # Checked first: "_per_s" also ends with "_s".
    if name.endswith(HIGHER_SUFFIXES):
        return "higher"
    if name.endswith(LOWER_SUFFIXES):
        return "lower"
    if any(part in LOWER_PARTS for part in re.split(r"[_\-]", name)):
        return "lower"
    return None


def is_throughput(metric: str) -> bool:
    return metric.lower().rsplit(".", 1)[-1].endswith(THROUGHPUT_SUFFIXES)


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / |median| in percent; None when the median is 0 and the values differ."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return 0.0
    med = statistics.median(values)
    if med == 0:
        return None
    return 100.0 * (hi - lo) / abs(med)


def percentiles(values: Iterable[float], qs: Iterable[float] = (50, 90, 99)) -> dict[str, float | None]:
    """``{"p50": ..., ...}`` by linear interpolation between closest ranks; None when empty."""
    xs = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        if not xs:
            out[f"p{q:g}"] = None
            continue
        pos = (len(xs) - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[f"p{q:g}"] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out


def summarize(values: Iterable[float], metric: str, noisy_pct: float = DEFAULT_NOISY_PCT) -> dict:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    d = direction(metric)
    out: dict = {"n": len(vals), "direction": d}
    if not vals:
        out.update(best=None, median=None, min=None, max=None, spread_pct=None,
                   flags=["no successful run"])
        return out
    sp = spread_pct(vals)
    best = max(vals) if d == "higher" else min(vals) if d == "lower" else None
    flags: list[str] = []
    if len(vals) == 1:
        flags.append(SINGLE_PASS)
    if sp is None or sp > noisy_pct:
        flags.append(NOISY)
    out.update(best=best, median=statistics.median(vals), min=min(vals), max=max(vals),
               spread_pct=None if sp is None else round(sp, 3), flags=flags)
    return out


def _overlap(a: dict, b: dict) -> bool:
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def pair_flags(a: dict, b: dict) -> list[str]:
    """The noise flags of a ratio or difference of two summaries, from the pair itself: ``NOT A
    RANKING`` when their [min, max] ranges overlap or either has one pass, and ``n=N`` when
    either has fewer than three passes (a median of two is their mean)."""
    flags = []
    n = min(a.get("n") or 1, b.get("n") or 1)
    if n < 2 or _overlap(a, b):
        flags.append(NOT_A_RANKING)
    if n < 3:
        flags.append(f"n={n}")
    return flags


def rank(summaries: dict[str, dict], metric: str) -> dict:
    """Order arms by median in the metric's direction.

    When the top two arms' [min, max] ranges overlap the order is reported as
    ``NOT A RANKING`` and both arms carry the flag.
    """
    d = direction(metric)
    usable = {a: s for a, s in summaries.items() if s.get("median") is not None}
    out: dict = {"metric": metric, "direction": d, "order": [], "leader": None, "flags": []}
    if d is None:
        out["flags"].append("no direction: not ranked")
        return out
    order = sorted(usable, key=lambda a: usable[a]["median"], reverse=(d == "higher"))
    out["order"] = order
    if len(order) < 2:
        return out
    first, second = usable[order[0]], usable[order[1]]
    if _overlap(first, second) or first["n"] < 2 or second["n"] < 2:
        # One pass has no spread to be outside of; it cannot rank either.
        out["flags"].append(NOT_A_RANKING)
        for a in order[:2]:
            if NOT_A_RANKING not in usable[a]["flags"]:
                usable[a]["flags"].append(NOT_A_RANKING)
    else:
        out["leader"] = order[0]
        ref = second["median"]
        if ref:
            out["leader_vs_second"] = round(first["median"] / ref, 4)
    return out


def summary_rows(metrics: dict[str, dict], label: str, key_w: int, num_w: int) -> list[str]:
    """Text table of summaries (best, median, min, max, spread, n, flags), header first."""
    rows = [f"{label:<{key_w}} {'best':>{num_w}} {'median':>{num_w}} {'min':>{num_w}} "
            f"{'max':>{num_w}} {'spread':>8}  n  flags"]
    for k, s in metrics.items():
        sp = "-" if s["spread_pct"] is None else f"{s['spread_pct']:.1f}%"
        rows.append(f"{k:<{key_w}} {s['best']:>{num_w}.2f} {s['median']:>{num_w}.2f} "
                    f"{s['min']:>{num_w}.2f} {s['max']:>{num_w}.2f} {sp:>8}  {s['n']}  "
                    f"{' | '.join(s['flags'])}")
    return rows
