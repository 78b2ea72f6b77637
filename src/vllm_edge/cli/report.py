"""`vllm-edge report`: regenerate docs/results/results.md, docs/results/measured.md, README.md's
measured section and its plots from benchmarks/results/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_edge.bench.report import results as results_report
from vllm_edge.cli.args import reported

NAME = "report"
HELP = ("regenerate docs/results/ (results, measured, comparisons, the audit trail), README.md's measured "
        "section, its plots and the guides' generated tables from benchmarks/results/")
DESCRIPTION = ("Reads every *.json and *.jsonl in --results and rewrites the part "
               f"of --doc between {results_report.BEGIN} and {results_report.END}. When --results is a "
               "repository's benchmarks/results, it also rewrites that repository's docs/results/measured.md "
               "(every claim), docs/results/comparisons.md, docs/results/README.md (the audit trail: "
               "each artifact family's host, dates and command), README.md's measured section (the "
               "headline claims) and the guides' generated tables. No engine starts.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default=results_report.DEFAULT_RESULTS,
                   help="artifact directory (default %(default)s)")
    p.add_argument("--doc", default=results_report.DEFAULT_DOC,
                   help="markdown file to update (default %(default)s)")
    p.add_argument("--plots-dir", default=None, help="where PNGs go (default: the results directory)")


def run(args: argparse.Namespace) -> int:
    from vllm_edge.bench.report import claims, guide_tables

    with reported(RuntimeError, ValueError):
        out = results_report.report(args.results, args.doc, args.plots_dir)
        readme = results_report.default_readme(args.results)
        # a repository's own results also own the generated tables in its guides
        out["guides"] = guide_tables.splice_guides(args.results, readme.parent) if readme else []
    print(f"wrote {out['doc']} from {out['artifacts']} artifact record(s); plots: "
          + (", ".join(out["plots"]) or "none"))
    if out["readme"]:
        print(f"wrote the measured section of {out['readme']} and every claim to "
              f"{Path(out['readme']).parent / claims.PAGE}")
    for g in out["guides"]:
        print(f"wrote the generated table in {g}")
    for page in out.get("pages") or []:
        print(f"wrote {page}")
    for s in out["skipped"]:
        print(f"skipped {s}", file=sys.stderr)
    return 0
