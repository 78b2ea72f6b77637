"""`vllm-edge models ...`: prepare, import, export, repack, build and list checkpoints."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_commands

NAME = "models"
HELP = "prepare and import models"
GROUP = True
SUBCOMMANDS = {name: f"vllm_edge.cli.models.{module}" for name, module in (
    ("prepare", "prepare"), ("import-gguf", "import_gguf"), ("export-gguf", "export_gguf"),
    ("export-npu", "export_npu"),
    ("repack-gptq", "repack_gptq"), ("synthetic", "synthetic"), ("build-vlm", "build_vlm"),
    ("list", "list_models"), ("rm", "rm"),
)}


def add_args(p: argparse.ArgumentParser) -> None:
    add_commands(p, "models_command", SUBCOMMANDS)


def run(args: argparse.Namespace) -> int:
    return args.func(args)
