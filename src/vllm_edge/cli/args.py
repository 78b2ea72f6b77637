"""Flags shared by several commands, defined once, and the registry helper every command
group uses. Torch-free: `--help` must not import torch or vLLM."""

from __future__ import annotations

import argparse
import contextlib
import importlib
from typing import Callable, Iterator

from vllm_edge.common.errors import EdgeError
from vllm_edge.quant import formats
from vllm_edge.quant.groups import DEFAULT_GROUP, GROUPS

MODEL_HELP = "'default', an embedded key, a GGUF file, or a model directory"
# every weight format of the registry
QUANT_SCHEMES = formats.names()


def add_model(p: argparse.ArgumentParser, default: str | None = "default", help: str = MODEL_HELP,
              **kw) -> None:
    p.add_argument("--model", default=default, help=help, **kw)


def add_threads(p: argparse.ArgumentParser, default: int | None = None,
                help: str = "use the first N cores of the core set (vLLM binds one thread per core)") -> None:
    p.add_argument("--threads", type=int, default=default, help=help)


def add_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpus", default=None, metavar="0,1", help="core set (default: our affinity)")


def add_out(p: argparse.ArgumentParser, default: str | None = None,
            help: str = "write the full result JSON with provenance here") -> None:
    p.add_argument("--out", default=default, help=help)


def add_output(p: argparse.ArgumentParser, choices: tuple[str, ...] = ("md", "json"),
               default: str = "md") -> None:
    p.add_argument("-o", "--output", choices=choices, default=default,
                   help="md: human-readable text (default); json: one JSON object")


def add_quant(p: argparse.ArgumentParser, choices: tuple[str, ...] = QUANT_SCHEMES,
              default: str | None = None, help: str | None = None) -> None:
    p.add_argument("--quant", choices=choices, default=default, help=help)


def add_weight_quant(p: argparse.ArgumentParser) -> None:
    """`run` and `serve`: the weight path, chosen for this CPU or unquantized."""
    p.add_argument("--quant", choices=("auto", "none"), default="auto",
                   help="auto: the weight path chosen for this CPU (4-bit); none: unquantized bf16")


def add_group(p: argparse.ArgumentParser, help: str = "input columns per scale (docs/guide/quantize.md)") -> None:
    p.add_argument("--group", type=int, choices=GROUPS, default=DEFAULT_GROUP, help=help)


def add_parallel(p: argparse.ArgumentParser) -> None:
    """`run` and `serve`: vLLM's tensor and pipeline parallelism, one process per rank."""
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split every layer over N ranks (the allowed cores are split between them)")
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1, metavar="N",
                   help="split the layers into N stages, one rank each")


def add_speculative(p: argparse.ArgumentParser) -> None:
    """`run` and `serve`: vLLM's speculative decoding (docs/guide/run.md#speculative-decoding)."""
    from vllm_edge.runtime.speculative import METHODS

    p.add_argument("--speculative", choices=METHODS, default="off",
                   help="ngram: propose the tokens that followed the last few tokens where they "
                        "appeared earlier in the prompt or answer, and check them all in one step "
                        "(pays when the answer copies its input; no draft model). Greedy answers "
                        "keep the model's tokens up to rounding; requests with min_p or logit_bias "
                        "are refused. auto: ngram only while the request runs alone and its recent "
                        "proposals were kept (default: %(default)s)")


def add_json_schema(p: argparse.ArgumentParser) -> None:
    """`bench speed` and `bench llamacpp`: decode every run under a JSON schema."""
    p.add_argument("--json-schema", default=None, metavar="long-text|FILE",
                   help="decode every run under this JSON schema (vLLM: structured outputs; "
                        "llama.cpp: a GBNF grammar); long-text has no valid output under 4000 "
                        "characters, so a tg run never reaches the grammar's end")


def add_llamacpp_engine(p: argparse.ArgumentParser, vllm_help: str) -> None:
    """`agent run` and `bench constrained`: the same work on llama.cpp in this process."""
    p.add_argument("--engine", choices=("vllm", "llamacpp"), default="vllm",
                   help=f"vllm: {vllm_help}; llamacpp: --gguf through llama-cpp-python in this process")
    p.add_argument("--gguf", default=None, help="with --engine llamacpp: the GGUF file to run")
    p.add_argument("--chat-template", default=None,
                   help="with --engine llamacpp: a Jinja chat template that writes hermes <tool_call> blocks "
                        "(default: the one serve uses for the model, else the GGUF's own)")
    p.add_argument("--threads", type=int, default=None,
                   help="with --engine llamacpp: threads (default: our cores)")


def check_llamacpp_engine(args: argparse.Namespace, server_flags: str, has_server: bool) -> None:
    """ValueError for flags of the other engine or a missing GGUF; ``has_server``: a server flag
    (``server_flags``, for the message) was given."""
    import os

    if args.engine == "llamacpp":
        if has_server:
            raise ValueError(f"--engine llamacpp runs the GGUF in this process: no {server_flags}")
        if not args.gguf:
            raise ValueError("--engine llamacpp needs --gguf PATH (the GGUF file to run)")
        if not os.path.isfile(args.gguf):
            raise ValueError(f"--gguf {args.gguf}: no such file")
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads {args.threads}: must be at least 1")
    elif args.gguf or args.chat_template or args.threads is not None:
        raise ValueError("--gguf, --chat-template and --threads are for --engine llamacpp")


def add_torch_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="bfloat16", help="torch dtype of the engine (default %(default)s)")


def weight_dtype(quant: str) -> str:
    """`--quant auto|none` as the weight-path dtype (`auto` or `bf16`)."""
    return "bf16" if quant == "none" else quant


def add_commands(parser: argparse.ArgumentParser, dest: str, modules: dict[str, str],
                 only: str | None = None, before: Callable[[argparse.Namespace], None] | None = None) -> None:
    """One subparser per command module (NAME, HELP, add_args, run; DESCRIPTION optional).
    With ``only``, just that command's module is imported; ``before`` runs ahead of every
    command's ``run`` (a group's check of its commands' arguments)."""
    sub = parser.add_subparsers(dest=dest, required=True)
    for name, module in modules.items():
        if only is not None and name != only:
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", None))
        mod.add_args(p)
        if not getattr(mod, "GROUP", False):
            p.set_defaults(func=mod.run if before is None else _after(before, mod.run))


def _after(check: Callable[[argparse.Namespace], None],
           run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def checked(args: argparse.Namespace) -> int:
        check(args)
        return run(args)
    return checked


@contextlib.contextmanager
def reported(*types: type[BaseException]) -> Iterator[None]:
    """Builtin errors (ValueError, FileNotFoundError, ...) that a library function raises for
    a person's input, reported as EdgeError (``error: <message>``, exit 2)."""
    try:
        yield
    except EdgeError:
        raise
    except types as exc:
        raise EdgeError(str(exc)) from exc
