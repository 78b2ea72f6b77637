"""`vllm-edge grid SPEC`: benchmark arms x passes, rotated, judged inside their noise."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_edge.cli.args import add_cpus, add_out
from vllm_edge.common.errors import EdgeError

NAME = "grid"
HELP = "run benchmark arms x passes, rotated, and judge them inside their noise"
DESCRIPTION = ("Each arm is a command plus environment; its metrics are the last JSON "
               "object line it prints. Exit codes: 0 done, 1 regression, 2 bad spec, "
               "3 host busy, 4 host lock held, 5 an arm never succeeded.")

def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.common import stats

    p.add_argument("spec", help="grid spec JSON (see vllm_edge/bench/grid/runner.py)")
    p.add_argument("--passes", type=int, default=3, help="passes over all arms (default 3)")
    p.add_argument("--warmup", action="store_true",
                   help="run every arm once first (fills its compile cache); not summarized")
    add_out(p, help="result directory (default benchmarks/results/grid/<spec name>)")
    p.add_argument("--work-dir", default=None,
                   help="per-arm VLLM_CACHE_ROOTs live here (default: a fresh dir under VLLM_EDGE_HOME/grid)")
    add_cpus(p)
    p.add_argument("--allow-busy", action="store_true",
                   help="run even if the target cores are busy; passes are marked busy")
    p.add_argument("--busy-threshold", type=float, default=grid.DEFAULT_BUSY_PCT,
                   help="percent busy on any target core that counts as contended (default %(default)s)")
    p.add_argument("--noisy-pct", type=float, default=stats.DEFAULT_NOISY_PCT,
                   help="spread above which an arm is flagged NOISY (default %(default)s)")
    p.add_argument("--lock-file", default=str(grid.DEFAULT_LOCK), help="advisory host lock file")
    p.add_argument("--wait-lock", action="store_true", help="queue behind a running measurement")
    p.add_argument("--check", default=None, metavar="EXPECTATIONS.json",
                   help="regression gate; exit 1 when a gated metric regressed")
    p.add_argument("--min-band-pct", type=float, default=grid.DEFAULT_MIN_BAND_PCT,
                   help="floor of the gate's band half-width (default %(default)s%%)")
    p.add_argument("--write-expectations", default=None, metavar="PATH",
                   help="write this run's medians and spreads as an expectations file")


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 done, 1 regression (--check), 2 bad spec, 3 host busy, 4 host lock held
    (SpecError, HostBusy and LockHeld carry theirs), 5 an arm never succeeded."""
    from vllm_edge.bench.grid import runner as grid
    from vllm_edge.common import atomic
    from vllm_edge.common.pinning import parse_int_list

    spec = grid.load_spec(args.spec)
    out_dir = Path(args.out) if args.out else Path("benchmarks/results/grid") / grid.slugify(spec["name"])
    cores = parse_int_list(args.cpus, "--cpus", minimum=0) or None
    summary = grid.run_grid(spec, args.passes, out_dir, work_dir=args.work_dir,
                            allow_busy=args.allow_busy, busy_threshold_pct=args.busy_threshold,
                            noisy_pct=args.noisy_pct, lock_path=args.lock_file,
                            wait_lock=args.wait_lock, cores=cores, warmup=args.warmup)
    print(grid.format_summary(summary))
    print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'results.jsonl'}")
    if args.write_expectations:
        atomic.write_json(args.write_expectations, grid.expectations_from_summary(summary))
        print(f"wrote expectations {args.write_expectations}")
    code = grid.EXIT_OK
    if args.check:
        try:
            exp = json.loads(Path(args.check).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise EdgeError(f"cannot read expectations {args.check}: {exc}",
                            exit_code=grid.EXIT_SPEC) from exc
        result = grid.check(summary, exp, min_band_pct=args.min_band_pct)
        summary["check"] = result
        atomic.write_json(out_dir / "summary.json", summary)
        print(grid.format_check(result))
        if result["regressed"]:
            code = grid.EXIT_REGRESSION
    never = [a for a, c in summary["runs"].items() if c["ok"] == 0]
    if never and code == grid.EXIT_OK:
        # a result, not a usage error: the summary above is still printed and written
        print(f"error: arm(s) with no successful run: {', '.join(never)}", file=sys.stderr)
        code = grid.EXIT_ARM_FAILED
    return code
