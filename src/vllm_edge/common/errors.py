"""The one base of every error vllm-edge reports to a person.

The CLI catches :class:`EdgeError` once, prints ``error: <message>`` and exits with
the error's ``exit_code``; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class EdgeError(Exception):
    """A failure with a message a person can act on."""

    exit_code = 2


class UsageError(EdgeError, ValueError):
    """Bad arguments, caught before any work starts."""
