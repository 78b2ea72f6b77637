"""The one base of every error vllm-edge reports to a person.

The CLI catches :class:`EdgeError` once, prints ``error: <message>`` and exits with
the error's ``exit_code``; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class EdgeError(Exception):
    """A failure with a message a person can act on. A subclass may set its own
    ``exit_code``; ``exit_code=`` overrides it for one raise."""

    exit_code = 2

    def __init__(self, *args: object, exit_code: int | None = None) -> None:
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(EdgeError, ValueError):
    """Bad arguments, caught before any work starts."""
