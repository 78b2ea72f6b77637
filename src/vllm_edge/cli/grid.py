"""The `vllm-edge grid` subcommand (kept out of cli.py so the harness owns its flags)."""

from __future__ import annotations

import argparse

from vllm_edge.bench.grid import runner as grid
from vllm_edge.common import stats


def _cmd_grid(args: argparse.Namespace) -> int:
    return grid.main_from_args(args)


def add_grid_commands(sub: "argparse._SubParsersAction") -> None:
    g = sub.add_parser(
        "grid", help="run benchmark arms x passes, rotated, and judge them inside their noise",
        description="Each arm is a command plus environment; its metrics are the last JSON "
                    "object line it prints. Exit codes: 0 done, 1 regression, 2 bad spec, "
                    "3 host busy, 4 host lock held, 5 an arm never succeeded.")
    g.add_argument("spec", help="grid spec JSON (see vllm_edge/bench/grid/runner.py)")
    g.add_argument("--passes", type=int, default=3, help="passes over all arms (default 3)")
    g.add_argument("--warmup", action="store_true",
                   help="run every arm once first (fills its compile cache); not summarized")
    g.add_argument("--out", default=None,
                   help="result directory (default benchmarks/results/grid/<spec name>)")
    g.add_argument("--work-dir", default=None,
                   help="per-arm VLLM_CACHE_ROOTs live here (default: a fresh dir under VLLM_EDGE_HOME/grid)")
    g.add_argument("--cores", default=None, help="target cores, e.g. 0,1 (default: spec, else our affinity)")
    g.add_argument("--allow-busy", action="store_true",
                   help="run even if the target cores are busy; passes are marked busy")
    g.add_argument("--busy-threshold", type=float, default=grid.DEFAULT_BUSY_PCT,
                   help="percent busy on any target core that counts as contended (default %(default)s)")
    g.add_argument("--noisy-pct", type=float, default=stats.DEFAULT_NOISY_PCT,
                   help="spread above which an arm is flagged NOISY (default %(default)s)")
    g.add_argument("--lock-file", default=str(grid.DEFAULT_LOCK), help="advisory host lock file")
    g.add_argument("--wait-lock", action="store_true", help="queue behind a running measurement")
    g.add_argument("--check", default=None, metavar="EXPECTATIONS.json",
                   help="regression gate; exit 1 when a gated metric regressed")
    g.add_argument("--min-band-pct", type=float, default=grid.DEFAULT_MIN_BAND_PCT,
                   help="floor of the gate's band half-width (default %(default)s%%)")
    g.add_argument("--write-expectations", default=None, metavar="PATH",
                   help="write this run's medians and spreads as an expectations file")
    g.set_defaults(func=_cmd_grid)
