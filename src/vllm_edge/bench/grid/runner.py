"""Grid runner: arms x passes, rotated, judged by :mod:`stats`.

A spec is JSON::

    {"name": "int4-vs-bf16",            # optional; default: the spec file stem
     "cores": [0, 1],                   # optional; default: our affinity
     "model": "/path/to/model",         # optional; fingerprinted into provenance
     "threads": 2,                      # optional; recorded into provenance
     "metrics": ["tg128_tps"],          # optional; default: every numeric key seen
     "timeout_s": 1800,                 # optional per-run timeout
     "pairs": [["bf16", "int4"]],       # optional A/B pairs, each judged on its own
     "arms": [{"name": "bf16", "cmd": ["python", "bench.py"], "env": {"X": "1"}}]}

An arm command starting with ``python`` runs under this interpreter; an argument starting
with ``~/`` is a path under the running user's home. Each run
is a subprocess pinned to ``cores`` whose metrics are the last JSON
object line it prints on stdout. Each arm gets its own ``VLLM_CACHE_ROOT``
under the work dir, kept across passes (so warm passes are warm) and never
shared between arms (so one arm's compile artifacts cannot serve another). An
arm that sets ``VLLM_CACHE_ROOT`` in its ``env`` keeps it: that is how a test of
cache reuse opts out.

Exit codes of `vllm-edge grid` (:mod:`vllm_edge.cli.grid`): 0 done, 1 regression (``--check``),
2 bad spec, 3 host busy, 4 host lock held, 5 an arm never succeeded.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vllm_edge.common import atomic, stats
from vllm_edge.common.errors import EdgeError
from vllm_edge.common.hw import sample_cpu_busy
from vllm_edge.common.jsonline import last_json_line
from vllm_edge.models import store

EXIT_OK, EXIT_REGRESSION, EXIT_SPEC, EXIT_BUSY, EXIT_LOCKED, EXIT_ARM_FAILED = 0, 1, 2, 3, 4, 5

DEFAULT_BUSY_PCT = 20.0
DEFAULT_LOCK = Path("/tmp/vllm-edge-bench.lock")
STDERR_TAIL = 4000
# Floor under gate bands: a spread measured over 3 passes underestimates the real one.
DEFAULT_MIN_BAND_PCT = 5.0

Sampler = Callable[[list[int], float], dict[int, float]]


class SpecError(EdgeError, ValueError):
    pass


# --- contention guard --------------------------------------------------------

def contention(cores: list[int], threshold_pct: float, sampler: Sampler = sample_cpu_busy,
               seconds: float = 1.0) -> dict:
    per_core = sampler(cores, seconds)
    worst = max(per_core.values()) if per_core else 0.0
    # The worst core decides: an arm using every target core waits on the slowest.
    return {"per_core_busy_pct": per_core, "max_busy_pct": worst,
            "threshold_pct": threshold_pct, "busy": worst > threshold_pct}


# --- host lock ---------------------------------------------------------------

class LockHeld(EdgeError, RuntimeError):
    exit_code = EXIT_LOCKED

    def __init__(self, path: Path, holder: str):
        self.path, self.holder = path, holder
        super().__init__(f"host benchmark lock {path} is held by {holder}; "
                         "another measurement is running on this host. Wait for it, "
                         "or pass --wait-lock to queue behind it.")


class HostLock:
    """Advisory flock so two harness runs never measure each other."""

    def __init__(self, path: str | os.PathLike = DEFAULT_LOCK, wait: bool = False):
        self.path, self.wait = Path(path), wait
        self._fd: int | None = None

    def __enter__(self) -> "HostLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "an unknown process"
            os.close(fd)
            raise LockHeld(self.path, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv)[:200]}) since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# --- spec and runs -----------------------------------------------------------

@dataclass
class Arm:
    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)


def slugify(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "arm"


def load_spec(spec: dict | str | os.PathLike) -> dict:
    if not isinstance(spec, dict):
        path = Path(spec)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError(f"cannot read grid spec {path}: {exc}") from None
        data.setdefault("name", path.stem)
        spec = data
    arms = spec.get("arms")
    if not isinstance(arms, list) or not arms:
        raise SpecError("grid spec needs a non-empty 'arms' list")
    parsed, slugs = [], set()
    for i, a in enumerate(arms):
        if isinstance(a, Arm):  # already parsed
            a = {"name": a.name, "cmd": a.cmd, "env": a.env}
        if not isinstance(a, dict) or "name" not in a or "cmd" not in a:
            raise SpecError(f"arm {i}: needs 'name' and 'cmd'")
        cmd = a["cmd"]
        if not (isinstance(cmd, list) and cmd and all(isinstance(x, str) for x in cmd)):
            raise SpecError(f"arm {a['name']!r}: 'cmd' must be a non-empty argv list of strings")
        env = {str(k): str(v) for k, v in (a.get("env") or {}).items()}
        slug = slugify(a["name"])
        if slug in slugs:
            raise SpecError(f"arm names must be distinct (after slugging): {a['name']!r}")
        slugs.add(slug)
        parsed.append(Arm(a["name"], list(cmd), env))
    pairs = spec.get("pairs") or []
    names = {a.name for a in parsed}
    if not isinstance(pairs, list):
        raise SpecError("'pairs' must be a list of [arm_a, arm_b] name pairs")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and pair[0] != pair[1]):
            raise SpecError(f"pairs[{i}]: expected two distinct arm names, got {pair!r}")
        unknown = [n for n in pair if n not in names]
        if unknown:
            raise SpecError(f"pairs[{i}]: no arm named {', '.join(map(repr, unknown))}")
    out = dict(spec)
    out["arms"] = parsed
    out["pairs"] = [list(p) for p in pairs]
    out.setdefault("name", "grid")
    return out


def rotation(n_arms: int, pass_index: int) -> list[int]:
    """Pass k starts at arm k mod n, so no arm always runs first (cold host) or last."""
    k = pass_index % n_arms
    return list(range(k, n_arms)) + list(range(k))


def _flatten(obj: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[key] = float(v)
        elif isinstance(v, dict):
            out.update(_flatten(v, key + "."))
    return out


def run_arm(arm: Arm, cache_root: Path, cores: list[int] | None, timeout: float | None) -> dict:
    env = dict(os.environ)
    env["VLLM_CACHE_ROOT"] = str(cache_root)
    env.update(arm.env)  # an arm may pin its own cache root on purpose
    root = Path(env["VLLM_CACHE_ROOT"])
    cold = not root.exists() or not any(root.iterdir())
    root.mkdir(parents=True, exist_ok=True)
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    rec: dict[str, Any] = {"arm": arm.name, "cmd": arm.cmd, "env": arm.env,
                           "cache_root": str(root), "cache_cold": cold,
                           "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    # "python" means this interpreter, so a spec runs the same venv wherever it is launched.
    argv = [sys.executable, *arm.cmd[1:]] if arm.cmd[0] == "python" else list(arm.cmd)
    # "~/..." is the running user's home, so a spec names a per-user file without a machine path
    argv = [os.path.expanduser(a) if a.startswith("~/") else a for a in argv]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=pin)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        rec.update(ok=False, returncode=None, wall_s=round(time.perf_counter() - t0, 3),
                   error=f"timeout after {timeout} s", stderr_tail=err[-STDERR_TAIL:], metrics={})
        return rec
    except OSError as exc:
        rec.update(ok=False, returncode=None, wall_s=0.0, error=f"cannot start: {exc}",
                   stderr_tail="", metrics={})
        return rec
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    rec["returncode"] = proc.returncode
    out: dict | None = None
    try:
        out = last_json_line(proc.stdout)
    except ValueError:
        pass
    if proc.returncode != 0 or not isinstance(out, dict):
        rec.update(ok=False, metrics={}, stderr_tail=proc.stderr[-STDERR_TAIL:],
                   error=(f"exit code {proc.returncode}" if proc.returncode != 0
                          else "no JSON object line on stdout"))
        return rec
    rec.update(ok=True, metrics=_flatten(out), output=out)
    return rec


def default_work_dir(name: str) -> Path:
    from vllm_edge import envs

    return envs.home() / "grid" / f"{slugify(name)}-{time.strftime('%Y%m%d-%H%M%S')}"


def judge_pairs(per_metric: dict, pairs: list[list[str]]) -> list[dict]:
    """Each A/B pair ranked on its own: with more than two arms the overall
    ranking only compares the top two, which may not be the lever under test."""
    import copy

    out = []
    for a, b in pairs:
        metrics = {}
        for m, block in per_metric.items():
            two = {n: copy.deepcopy(block["arms"][n]) for n in (a, b)}
            r = stats.rank(two, m)
            ma, mb = two[a].get("median"), two[b].get("median")
            metrics[m] = {"ranking": r, "medians": {a: ma, b: mb},
                          "b_over_a": round(mb / ma, 4) if ma and mb is not None else None}
        out.append({"a": a, "b": b, "metrics": metrics})
    return out


def summarize_runs(records: list[dict], arms: list[str], metrics: list[str] | None = None,
                   noisy_pct: float = stats.DEFAULT_NOISY_PCT,
                   pairs: list[list[str]] | None = None) -> dict:
    ok = [r for r in records if r.get("ok")]
    if metrics is None:
        seen: dict[str, None] = {}
        for r in ok:
            for k in r["metrics"]:
                seen.setdefault(k, None)
        metrics = list(seen)
    per_metric: dict[str, dict] = {}
    for m in metrics:
        summ = {a: stats.summarize([r["metrics"][m] for r in ok if r["arm"] == a and m in r["metrics"]],
                                   m, noisy_pct) for a in arms}
        per_metric[m] = {"arms": summ, "ranking": stats.rank(summ, m)}
    runs = {a: {"ok": sum(1 for r in ok if r["arm"] == a),
                "failed": sum(1 for r in records if r["arm"] == a and not r.get("ok")),
                "busy": sum(1 for r in records if r["arm"] == a and r.get("busy"))}
            for a in arms}
    out = {"metrics": per_metric, "runs": runs}
    if pairs:
        out["pairs"] = judge_pairs(per_metric, pairs)
    return out


# --- regression gate ---------------------------------------------------------

THROUGHPUT_UNGATED = "ungated (throughput on a shared host)"


def expectations_from_summary(summary: dict) -> dict:
    """Medians and observed spreads of a run, in the format ``--check`` reads."""
    arms: dict[str, dict] = {}
    for m, block in summary["metrics"].items():
        for a, s in block["arms"].items():
            if s.get("median") is None:
                continue
            arms.setdefault(a, {})[m] = {"median": s["median"], "spread_pct": s["spread_pct"], "n": s["n"]}
    return {"source": summary.get("name"), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "arms": arms}


def check(summary: dict, expectations: dict, min_band_pct: float = DEFAULT_MIN_BAND_PCT) -> dict:
    """Compare medians with expected medians.

    Band half-width, in percent of the expected median: the expectation's own
    ``tolerance_pct`` if given, else the larger of the expected spread, the
    observed spread and ``min_band_pct``. Worse than the band is ``regressed``,
    better is ``improved``. Throughput metrics are reported, never gated.
    """
    results = []
    for arm, metrics in expectations.get("arms", {}).items():
        for m, exp in metrics.items():
            cur = summary["metrics"].get(m, {}).get("arms", {}).get(arm)
            d = stats.direction(m)
            row: dict[str, Any] = {"arm": arm, "metric": m, "expected_median": exp.get("median"),
                                   "median": None if cur is None else cur.get("median")}
            if stats.is_throughput(m):
                row["status"] = THROUGHPUT_UNGATED
            elif d is None:
                row["status"] = "ungated (metric name has no direction)"
            elif cur is None or cur.get("median") is None:
                row["status"] = "regressed"
                row["reason"] = "no successful run of this arm/metric"
            else:
                spreads = [exp.get("spread_pct"), cur.get("spread_pct"), min_band_pct]
                tol = exp.get("tolerance_pct")
                if tol is None:
                    tol = max(s for s in spreads if s is not None)
                base, med = float(exp["median"]), float(cur["median"])
                half = abs(base) * tol / 100.0
                lo, hi = base - half, base + half
                row["band"] = [lo, hi]
                row["tolerance_pct"] = tol
                worse = med > hi if d == "lower" else med < lo
                better = med < lo if d == "lower" else med > hi
                row["status"] = "regressed" if worse else "improved" if better else "ok"
            results.append(row)
    return {"rows": results, "regressed": any(r["status"] == "regressed" for r in results)}


# --- the grid ----------------------------------------------------------------

def run_grid(spec: dict | str | os.PathLike, passes: int, out_dir: str | os.PathLike,
             work_dir: str | os.PathLike | None = None, allow_busy: bool = False,
             busy_threshold_pct: float = DEFAULT_BUSY_PCT, sampler: Sampler = sample_cpu_busy,
             sample_seconds: float = 1.0, noisy_pct: float = stats.DEFAULT_NOISY_PCT,
             lock_path: str | os.PathLike | None = DEFAULT_LOCK, wait_lock: bool = False,
             cores: list[int] | None = None, log: Callable[[str], None] = print,
             warmup: bool = False, on_record: Callable[[dict], None] | None = None) -> dict:
    """Run the grid and write ``results.jsonl`` and ``summary.json`` into ``out_dir``.

    ``warmup`` runs every arm once before pass 0 (filling its compile cache); those
    runs are written with ``"warmup": true`` and left out of the summary.
    ``on_record`` sees each run's record as soon as it is written (progress bars).

    Raises :class:`HostBusy` before any run when the target cores are busy and
    ``allow_busy`` is false, and :class:`LockHeld` when another harness holds the lock.
    """
    from vllm_edge.common import provenance

    spec = load_spec(spec)
    if passes < 1:
        raise SpecError("--passes must be at least 1")
    arms: list[Arm] = spec["arms"]
    cores = cores or spec.get("cores") or sorted(os.sched_getaffinity(0))
    cores = [int(c) for c in cores]
    out_dir = Path(out_dir)
    work = Path(work_dir) if work_dir else default_work_dir(spec["name"])
    cache_roots = {a.name: work / "cache" / slugify(a.name) for a in arms}
    timeout = spec.get("timeout_s")

    lock = HostLock(lock_path, wait=wait_lock) if lock_path else None
    if lock:
        lock.__enter__()
    try:
        pre = contention(cores, busy_threshold_pct, sampler, sample_seconds)
        if pre["busy"] and not allow_busy:
            raise HostBusy(pre)
        results_path = out_dir / "results.jsonl"
        if results_path.exists():
            log(f"replacing previous {results_path}")
        atomic.write_text(results_path, "")
        records: list[dict] = []
        pass_meta = []
        warm_failed = []
        if warmup:
            for arm in arms:
                rec = run_arm(arm, cache_roots[arm.name], cores, timeout)
                rec.update({"pass": None, "warmup": True, "busy": pre["busy"]})
                atomic.append_jsonl(results_path, [rec])
                if not rec["ok"]:
                    warm_failed.append(arm.name)
                status = "ok" if rec["ok"] else f"FAILED ({rec['error']})"
                log(f"warm-up {arm.name}: {status} in {rec['wall_s']} s")
        for k in range(passes):
            # Pass 0 reuses the pre-flight sample; later passes are sampled afresh.
            c = pre if k == 0 else contention(cores, busy_threshold_pct, sampler, sample_seconds)
            order = rotation(len(arms), k)
            pass_meta.append({"pass": k, "order": [arms[i].name for i in order], **c})
            if c["busy"]:
                log(f"pass {k}: target cores busy (max {c['max_busy_pct']}% > "
                    f"{busy_threshold_pct}%); pass marked busy")
            for pos, i in enumerate(order):
                arm = arms[i]
                rec = run_arm(arm, cache_roots[arm.name], cores, timeout)
                rec.update({"pass": k, "position": pos, "busy": c["busy"]})
                records.append(rec)
                atomic.append_jsonl(results_path, [rec])
                status = "ok" if rec["ok"] else f"FAILED ({rec['error']})"
                log(f"pass {k} [{pos + 1}/{len(arms)}] {arm.name}: {status} in {rec['wall_s']} s")
                if on_record:
                    on_record(rec)
        model_dir = store.cached_dir(spec["model"]) if spec.get("model") else None
        summary = summarize_runs(records, [a.name for a in arms], spec.get("metrics"), noisy_pct,
                                 spec.get("pairs"))
        summary.update({
            "name": spec["name"], "description": spec.get("description"), "passes": passes,
            "cores": cores, "work_dir": str(work),
            "cache_roots": {a: str(p) for a, p in cache_roots.items()},
            "arms": [{"name": a.name, "cmd": a.cmd, "env": a.env} for a in arms],
            "pass_meta": pass_meta,
            "warmup": warmup, "warmup_failed": warm_failed,
            "busy_passes": [p["pass"] for p in pass_meta if p["busy"]],
            "noisy_pct": noisy_pct,
            "results_file": str(results_path),
            "provenance": provenance.collect(model=model_dir, threads=spec.get("threads"),
                                             extra={"target_cores": cores}),
        })
        atomic.write_json(out_dir / "summary.json", summary)
        return summary
    finally:
        if lock:
            lock.__exit__(None, None, None)


class HostBusy(EdgeError, RuntimeError):
    exit_code = EXIT_BUSY

    def __init__(self, sample: dict):
        self.sample = sample
        super().__init__(
            f"target cores are busy: {sample['per_core_busy_pct']} (max {sample['max_busy_pct']}% > "
            f"threshold {sample['threshold_pct']}%). Numbers taken now would measure the other "
            "load. Wait for the host to go quiet, or pass --allow-busy to run anyway with "
            "every pass marked busy.")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_summary(summary: dict) -> str:
    lines = []
    for m, block in summary["metrics"].items():
        r = block["ranking"]
        lines.append(f"{m} ({r['direction'] or 'no direction'}-is-better)")
        for arm in (r["order"] or list(block["arms"])):
            s = block["arms"][arm]
            lines.append(f"  {arm:<24} n={s['n']:<3} best={_fmt(s['best']):<10} "
                         f"median={_fmt(s['median']):<10} spread={_fmt(s['spread_pct'])}%  "
                         f"{' | '.join(s['flags'])}")
        if r["flags"]:
            lines.append(f"  -> {' | '.join(r['flags'])}")
        elif r["leader"]:
            lines.append(f"  -> leader: {r['leader']}")
    for p in summary.get("pairs", []):
        lines.append(f"pair {p['a']} -> {p['b']}:")
        for m, j in p["metrics"].items():
            r = j["ranking"]
            verdict = " | ".join(r["flags"]) or (f"leader: {r['leader']}" if r["leader"] else "-")
            lines.append(f"  {m:<24} b/a={_fmt(j['b_over_a'])}  {verdict}")
    for a, c in summary["runs"].items():
        if c["failed"]:
            lines.append(f"{a}: {c['failed']} failed run(s); see {summary.get('results_file')}")
    if summary.get("busy_passes"):
        lines.append(f"busy passes: {summary['busy_passes']} (host was contended; treat with suspicion)")
    return "\n".join(lines)


def format_check(result: dict) -> str:
    lines = ["regression gate:"]
    for r in result["rows"]:
        band = r.get("band")
        b = f" band [{_fmt(band[0])}, {_fmt(band[1])}]" if band else ""
        lines.append(f"  {r['arm']:<20} {r['metric']:<28} median={_fmt(r['median'])} "
                     f"expected={_fmt(r['expected_median'])}{b}: {r['status']}")
    return "\n".join(lines)
