"""`vllm-edge bench ...`: benchmarks (results go to benchmarks/results/)."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_commands

NAME = "bench"
HELP = "benchmarks (results go to benchmarks/results/)"
GROUP = True
SUBCOMMANDS = {name: f"vllm_edge.cli.bench.{module}" for name, module in (
    ("aot-cache", "aot_cache"), ("init-memory", "init_memory"), ("ledger", "ledger"),
    ("soak", "soak"), ("plugin-import", "plugin_import"), ("rmsnorm", "rmsnorm"),
    ("speed", "speed"), ("profile", "profile"), ("step", "step"), ("llamacpp", "llamacpp"),
    ("llamacpp-fidelity", "llamacpp_fidelity"), ("int4-micro", "int4_micro"),
    ("toolcalls", "toolcalls"), ("first-token", "first_token"), ("constrained", "constrained"),
    ("startup", "startup"), ("sampling", "sampling"), ("npu", "npu"), ("fuzz", "fuzz"),
    ("server", "server"), ("speech", "speech"), ("grounded", "grounded"),
    ("scale-prefetch", "scale_prefetch"), ("family-files", "family_files"),
)}


def add_args(p: argparse.ArgumentParser) -> None:
    add_commands(p, "bench_command", SUBCOMMANDS, before=_refuse_other_hosts_out)


def run(args: argparse.Namespace) -> int:
    return args.func(args)


def _refuse_other_hosts_out(args: argparse.Namespace) -> None:
    """Every bench's --out, before it measures (bench.compare.refuse_other_hosts_file); a
    bench that computes its own default file checks that one itself."""
    from vllm_edge.bench.compare import refuse_other_hosts_file

    refuse_other_hosts_file(getattr(args, "out", None))
