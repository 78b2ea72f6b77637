"""`vllm-edge <command>`: one module per command, imported only when that command runs.

Every command module exposes ``NAME``, ``HELP``, ``add_args(parser)`` and ``run(args) -> int``
(groups such as `models` and `bench` set ``GROUP = True`` and add their own subcommands).
Errors a person can act on are :class:`~vllm_edge.common.errors.EdgeError`; :func:`main`
prints them once as ``error: <message>`` and returns their ``exit_code``.
"""

from __future__ import annotations

import argparse
import sys

from vllm_edge.cli.args import add_commands
from vllm_edge.common.errors import EdgeError

COMMANDS = {name: f"vllm_edge.cli.{module}" for name, module in (
    ("doctor", "doctor"), ("models", "models"), ("run", "run"), ("serve", "serve"),
    ("bench", "bench"), ("quantize", "quantize"), ("grid", "grid"), ("fidelity", "fidelity"),
    ("report", "report"), ("agent", "agent"), ("compare", "compare"), ("bandwidth", "bandwidth"),
    ("ps", "ps"), ("stop", "stop"), ("speak", "speak"),
)}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, just that command (the others are not imported)."""
    p = argparse.ArgumentParser(prog="vllm-edge", description="vLLM on edge CPUs.")
    add_commands(p, "command", COMMANDS, only=only if only in COMMANDS else None)
    return p


def main(argv: list[str] | None = None) -> int:
    from vllm_edge.common import timeline

    if timeline.path():
        import time

        from vllm_edge.common.procmem import process_start_epoch

        timeline.record("interpreter", process_start_epoch(), time.time())
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # `serve ... -- <vLLM flags>`
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = build_parser(only=argv[0] if argv else None)
    args = parser.parse_args(argv)
    if extra and args.command != "serve":
        parser.error("arguments after `--` are only for `serve` (they go to vLLM)")
    args.vllm_extra = extra
    try:
        return int(args.func(args) or 0)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
