"""Atomic writes: write to a temp path beside the target, then rename.

A crash or a bad input never leaves a half-written model or result behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would survive the rename
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_result(out: str | os.PathLike | None, result: dict) -> dict:
    """A measurement's result, written to ``out`` when one is given; ``result`` then names the
    file in ``out`` (the file itself does not hold its own path)."""
    if out:
        write_json(out, result)
        result["out"] = str(out)
    return result


def append_jsonl(path: str | os.PathLike, records: list[dict]) -> Path:
    """Append records by rewriting the file atomically (results files are small)."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    new = "".join(json.dumps(r, default=str) + "\n" for r in records)
    return write_text(path, old + new)


@contextlib.contextmanager
def directory(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp directory beside ``final``; rename it to ``final`` on success.

    On any error the temp directory is removed and ``final`` is untouched.
    An existing ``final`` is replaced only after the new one is complete.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    tmp.chmod(0o755)
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def file_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``final`` for a writer that opens files by name;
    rename it to ``final`` on success, remove it on any error."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        tmp.chmod(0o644)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
