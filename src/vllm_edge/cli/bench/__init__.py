"""`vllm-edge bench ...`: benchmarks (results go to benchmarks/results/)."""

from __future__ import annotations

import argparse
from pathlib import Path

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
)}


def add_args(p: argparse.ArgumentParser) -> None:
    add_commands(p, "bench_command", SUBCOMMANDS,
                 before=lambda args: refuse_other_hosts_artifact(getattr(args, "out", None)))


def run(args: argparse.Namespace) -> int:
    return args.func(args)


def refuse_other_hosts_artifact(out: str | None) -> None:
    """Before any measuring: an artifact measured on another host is never replaced by this
    host's numbers (a table holds one host; docs/results/ are generated from these files)."""
    if not out or not str(out).endswith(".json"):
        return
    from vllm_edge.bench.compare import host_artifact, other_host
    from vllm_edge.common.errors import UsageError

    theirs = other_host(out)
    if theirs:
        raise UsageError(f"{out} holds a measurement on {theirs}, and this host is another: one "
                         f"host's artifact is never replaced by another's. Pass --out with a new "
                         f"file, for example {host_artifact(Path(out).with_suffix(''))}")
