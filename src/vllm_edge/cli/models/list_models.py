"""`vllm-edge models list`: embedded models and whether they are prepared."""

from __future__ import annotations

import argparse

NAME = "list"
HELP = "embedded models and whether they are prepared"


def add_args(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models import store

    for key, m in store.MODELS.items():
        path = store.prepared_dir(m)
        state = "prepared" if (path / "config.json").exists() else "not prepared"
        tag = " (default)" if key == store.DEFAULT else ""
        print(f"{key}{tag}: {m.description}; package {m.package}; {state} at {path}")
    return 0
