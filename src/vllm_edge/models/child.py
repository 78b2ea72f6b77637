"""A build runs a library function in a spawned child process: the conversion's and the
quantizer's memory never count in the caller's RssAnon (``run`` measures its own tree), and
the child inherits the caller's terminal, so its progress bars show where the user looks.

The child sends back one message: the function's result, or the error it raised. An
:class:`~vllm_edge.common.errors.EdgeError` comes back as its message, raised here as a
:class:`BuildFailed` naming what was being built; any other failure keeps its traceback on
the terminal. Builds are atomic (:mod:`vllm_edge.common.atomic`), so a child that fails or
is killed leaves nothing a later call would use.
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys
import traceback
from typing import Any

from vllm_edge.common.errors import EdgeError
from vllm_edge.models.errors import ModelNotAvailable


class BuildFailed(ModelNotAvailable):
    """A build in a child process failed; the message says what and why."""


def _target(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _child(ref: str, kwargs: dict[str, Any], conn: Any) -> None:
    try:
        result = _target(ref)(**kwargs)
    except EdgeError as exc:
        conn.send(("error", str(exc)))
        sys.exit(exc.exit_code)
    except BaseException as exc:
        traceback.print_exc()
        conn.send(("crash", f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    conn.send(("ok", result))


def run(ref: str, what: str, **kwargs: Any) -> Any:
    """Call ``module:function`` with ``kwargs`` in a spawned child and return its result
    (picklable). ``what`` names the build in errors."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(ref, kwargs, send), name=f"vllm-edge build: {what}",
                       daemon=False)
    proc.start()
    send.close()
    try:
        try:
            status, payload = receive.recv()
        except EOFError:  # died without a word: a signal, or the interpreter itself
            status, payload = "crash", None
        proc.join()
    finally:
        if proc.is_alive():  # the caller was interrupted: the child's atomic build is abandoned
            proc.terminate()
            proc.join(5)
        receive.close()
    if status == "ok":
        return payload
    if status == "error":
        raise BuildFailed(f"preparing {what} failed: {payload}; nothing was cached")
    detail = payload or f"the build process ended with exit code {proc.exitcode}"
    raise BuildFailed(f"preparing {what} failed ({detail}); its traceback is printed above, "
                      "and nothing was cached")
