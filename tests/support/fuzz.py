"""Seeded mutations for the fuzz tests (bytes cut, changed or overwritten with huge counts,
JSON values of the wrong type, JSON nested too deep), and what each case runs under: a
deadline that turns a hang into a failure, a memory cap that turns runaway allocation into
one, torch on one thread, and a snapshot that proves an input unchanged.

Every mutation takes a ``random.Random``, so a fixed seed replays the same cases."""

from __future__ import annotations

import contextlib
import random
import resource
import signal
import struct
import traceback
from pathlib import Path
from typing import Callable, Iterator

# Values a corrupt length or count field could hold: the edges of the field's width and
# sizes far past any file (a reader that trusts them hangs or allocates without end).
HUGE = (2**64 - 1, 2**63, 2**62 + 7, 2**40, 2**32 - 1, 2**31, 1 << 24)


class Hang(BaseException):
    """A case ran past its deadline. A BaseException, so ``except Exception`` in the code
    under test cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`Hang` in this (main) thread after ``seconds``; reset on exit."""
    def fire(_signum, _frame):
        raise Hang(f"{what}: still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def memory_cap(extra: int = 4 << 30) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``extra`` bytes, so a case
    that allocates without end fails with MemoryError (which the test reports) instead of
    drawing the kernel's OOM killer onto this machine's other work."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread: the fuzzed models are tiny, and two threads that spin-wait beside
    other work on this 2-core host made a run ten times slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def truncate(data: bytes, rng: random.Random, lo: int = 0, hi: int | None = None) -> bytes:
    """``data`` cut at a random offset in ``[lo, hi)`` (the whole file by default)."""
    hi = len(data) if hi is None else hi
    return data[: rng.randrange(lo, max(hi, lo + 1))]


def flip(data: bytes, rng: random.Random, lo: int = 0, hi: int | None = None, n: int = 1) -> bytes:
    """``data`` with ``n`` bytes in ``[lo, hi)`` replaced by a different random byte."""
    hi = len(data) if hi is None else hi
    out = bytearray(data)
    for _ in range(n):
        i = rng.randrange(lo, hi)
        out[i] ^= rng.randrange(1, 256)
    return bytes(out)


def put(data: bytes, offset: int, fmt: str, value: int | float) -> bytes:
    """``data`` with ``struct.pack(fmt, value)`` written over it at ``offset``."""
    raw = struct.pack(fmt, value)
    return data[:offset] + raw + data[offset + len(raw):]


def huge(rng: random.Random, bits: int = 64) -> int:
    """A value from :data:`HUGE` that fits ``bits`` bits."""
    return rng.choice([v for v in HUGE if v < 2**bits] + [2**bits - 1])


def junk(rng: random.Random, depth: int = 2) -> object:
    """A JSON value of a random type (what a careless or hostile writer puts in a field)."""
    kinds = ["str", "int", "float", "bool", "null", "list", "dict"] if depth else ["str", "int", "null"]
    kind = rng.choice(kinds)
    if kind == "str":
        return rng.choice(["", "x", "false", "0", "\u00e9\u2028", "a" * 300])
    if kind == "int":
        return rng.choice([0, -1, 1, 2**31, 2**63, 2**70])
    if kind == "float":
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf")])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [junk(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "type", "url", ""]): junk(rng, depth - 1) for _ in range(rng.randint(0, 3))}


def deep(n: int = 100_000) -> bytes:
    """JSON nested ``n`` deep: valid, and past any recursive parser's stack."""
    return b"[" * n + b"]" * n


def judge_write(write: Callable[[], None], src: Path, out: Path, what: str, *, deadline_s: float,
                refused: type[BaseException], done: str) -> tuple[str, str | None]:
    """Run one fuzzed write (``src`` to ``out``) under the deadline and the memory cap, and
    check the contract: it writes a complete build (``done``) or raises ``refused`` naming
    ``src`` and leaving no partial output, the input unchanged either way. Returns
    (``done``, ``"refused"`` or ``"broke"``; what broke the contract, or None)."""
    from support.checkpoints import no_partial_output
    from vllm_edge.common import manifest

    def state() -> object:
        return snapshot(src) if src.is_dir() else src.read_bytes()

    before = state()
    outcome, why = done, None
    try:
        with memory_cap(), deadline(deadline_s, what):
            write()
    except refused as exc:
        outcome = "refused"
        if str(src) not in str(exc):
            why = f"the error does not name the input: {exc}"
        elif not no_partial_output(out):
            why = f"refused ({exc}) but left {sorted(p.name for p in out.parent.iterdir())}"
    except BaseException as exc:  # the contract under test: nothing else may escape
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return "broke", f"{type(exc).__name__}: {str(exc)[:300]} (at {where.filename}:{where.lineno})"
    else:
        why = manifest.problem(out) and f"{done}, but the build is incomplete: {manifest.problem(out)}"
    if state() != before:
        why = "the input changed"
    return outcome, why
