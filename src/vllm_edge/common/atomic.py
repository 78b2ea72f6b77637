"""Atomic writes: write to a temp path beside the target, then rename.

A crash or a bad input never leaves a half-written model or result behind, and a
write never takes away what it did not make:

- a destination that exists and is not a vllm-edge build of the same kind is refused
  unless the caller forces it; a destination that is, contains or sits inside one of
  the inputs is always refused;
- files and directories are fsynced before the rename, so a power cut leaves the old
  build or the new one, not a directory of empty files;
- an existing build is swapped for the new one in one step (``renameat2`` with
  ``RENAME_EXCHANGE``), so there is never a moment with no build at the path;
- one writer per destination at a time (an ``fcntl`` lock beside it); leftovers of a
  killed writer (``.NAME.*.partial``) are removed by the next one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from vllm_edge.common import manifest
from vllm_edge.common.errors import EdgeError

# Files up to this size get a sha256 in the manifest's file list (configs, tokenizers);
# weights get their size only, which catches truncation and deletion for free.
HASH_LIMIT = 1 << 20


class DestinationError(EdgeError):
    """A write refused before any work: it would take away what it did not make."""


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
        _fsync_dir(path.parent)
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


# --- refusing what we did not make ------------------------------------------------------

def kind_of(directory: str | os.PathLike) -> str | None:
    """The kind of vllm-edge build in ``directory`` (its manifest's converter name, e.g.
    ``quantize``), or None when it is not one."""
    converter = manifest.read(directory).get("converter")
    return str(converter).split("/")[0] if converter else None


def check_destination(final: str | os.PathLike, *, kind: str | None = None,
                      inputs: Iterable[str | os.PathLike] = (), force: bool = False,
                      is_ours: Callable[[Path], bool] | None = None) -> Path:
    """Refuse, before any work, a write to ``final`` that could lose data; returns the
    resolved destination.

    - ``final`` equal to an input, inside an input directory, or containing an input:
      always refused.
    - ``final`` exists: allowed when it is an empty directory, a vllm-edge directory build
      of ``kind``, or a file ``is_ours`` recognises; otherwise refused unless ``force``.
    - the parent must be writable (checked by creating and removing a temp entry).
    """
    given = Path(final).expanduser()
    if given.is_symlink():
        raise DestinationError(f"{given}: is a symbolic link (to {os.readlink(given)}); "
                               "vllm-edge does not write through links, --force included: "
                               "pass the real path, or remove the link")
    final = given.resolve()
    for inp in inputs:
        src = Path(inp).expanduser().resolve()
        if final == src:
            raise DestinationError(f"{final}: the destination is the input itself; "
                                   "write the result to another path")
        if src.is_dir() and final.is_relative_to(src):
            raise DestinationError(f"{final}: the destination is inside the input directory {src}; "
                                   "write the result outside it")
        if src.is_relative_to(final):
            raise DestinationError(f"{final}: the destination contains the input {src}, "
                                   "which replacing it would delete; write the result elsewhere")
    if final.exists() or final.is_symlink():
        entries = list(final.iterdir()) if final.is_dir() and not final.is_symlink() else None
        if entries is not None:
            ours = not entries or (kind is not None and kind_of(final) == kind)
        else:
            ours = is_ours is not None and final.is_file() and is_ours(final)
        if not ours and not force:
            listed = entries if entries is not None else list(final.iterdir()) if final.is_dir() else None
            what = (f"a directory with {len(listed)} entries that is not a "
                    f"vllm-edge {kind or ''} build".replace("  ", " ")
                    if listed is not None else "a file vllm-edge did not write")
            raise DestinationError(f"{final}: exists and is {what}; choose another path, or "
                                   "pass --force to replace it")
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".probe", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise DestinationError(f"{final}: cannot write in {parent}: {exc.strerror or exc}") from None
    return final


# --- one writer at a time -------------------------------------------------------------

_held: dict[Path, int] = {}
_held_lock = threading.Lock()


@contextlib.contextmanager
def lock(final: str | os.PathLike) -> Iterator[None]:
    """Hold the write lock of ``final`` (``.NAME.lock`` beside it): another process that
    asks waits until this one is done. Re-entrant within a process."""
    final = Path(final).expanduser().resolve()
    with _held_lock:
        if _held.get(final):
            _held[final] += 1
            fd = None
        else:
            final.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(final.parent / f".{final.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        with _held_lock:
            _held[final] = 1
    try:
        yield
    finally:
        with _held_lock:
            _held[final] -= 1
            last = _held[final] == 0
            if last:
                del _held[final]
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def build_once(final: str | os.PathLike, want: dict[str, Any], build: Callable[[], Path], *,
               force: bool = False, ignore: tuple[str, ...] = ("source",), log: Any = None,
               redo: str = "building again", ready: str | None = None) -> Path:
    """``final`` when the build there is complete and its manifest agrees with ``want``
    (except on ``ignore``), else what ``build()`` returns; decided under ``final``'s lock, so a
    second builder waits and then finds the build ready. ``log`` gets ``ready`` (info) or why
    it is rebuilt, followed by ``redo`` (warning)."""
    with lock(final):
        why = manifest.mismatch(final, want, ignore)
        if not force and why is None:
            if log is not None and ready:
                log.info("%s", ready)
            return Path(final)
        if Path(final).exists() and why and log is not None:
            log.warning("%s; %s", why, redo)
        return build()


def is_leftover(name: str, final_name: str) -> bool:
    """``name`` is one of the entries this module makes beside ``final_name`` and only
    those: ``.NAME.old`` and ``.NAME.XXXXXXXX.partial`` / ``.probe`` (``tempfile``'s eight
    random characters). Not another destination's (``.NAME.v2.XXXXXXXX.partial`` belongs to
    ``NAME.v2``), nor a user's ``.NAME.bak.old``."""
    if name == f".{final_name}.old":
        return True
    prefix = f".{final_name}."
    if not name.startswith(prefix):
        return False
    return _TEMP_TAIL.fullmatch(name[len(prefix):]) is not None


# what tempfile.mkstemp/mkdtemp put between our prefix and suffix
_TEMP_TAIL = re.compile(r"[a-z0-9_]{8}\.(?:partial|probe)")


def clean_stale(final: str | os.PathLike) -> list[Path]:
    """Remove what killed writers left beside ``final`` (call with its lock held), and put
    back a build that a killed two-step swap had moved aside. Only this module's own names
    for ``final`` are touched (:func:`is_leftover`)."""
    final = Path(final)
    removed = []
    old = final.with_name(f".{final.name}.old")
    if not final.exists() and old.is_dir() and not old.is_symlink():
        os.replace(old, final)
    for p in final.parent.iterdir() if final.parent.is_dir() else []:
        if is_leftover(p.name, final.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            removed.append(p)
    return removed


# --- durability and the swap ------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step; False where the kernel or filesystem cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.replace(tmp, final)
    elif exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old build
    else:
        # Two steps: between them the old build waits at .NAME.old, where clean_stale
        # (the next writer) puts it back if this process dies.
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(final.parent)


def file_list(root: Path) -> dict[str, dict[str, Any]]:
    """Every regular file under ``root`` but the manifest: size, and sha256 when small."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == manifest.NAME:
            continue
        entry: dict[str, Any] = {"size": p.stat().st_size}
        if entry["size"] <= HASH_LIMIT:
            entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
        out[str(p.relative_to(root))] = entry
    return out


@contextlib.contextmanager
def directory(final: str | os.PathLike, *, kind: str | None = None,
              inputs: Iterable[str | os.PathLike] = (), force: bool = False) -> Iterator[Path]:
    """Yield a temp directory beside ``final``; on success it becomes ``final``.

    The destination is checked first (:func:`check_destination`), the write holds
    ``final``'s lock, and a manifest the body wrote gets the list of files (with sizes)
    that :func:`vllm_edge.common.manifest.problem` checks later. On any error the temp
    directory is removed and ``final`` is untouched.
    """
    final = check_destination(final, kind=kind, inputs=inputs, force=force)
    with lock(final):
        clean_stale(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
        tmp.chmod(0o755)
        try:
            yield tmp
            data = manifest.read(tmp)
            if data:
                data["files"] = file_list(tmp)
                manifest.write(tmp, data)
            fsync_tree(tmp)
            _swap_in(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


@contextlib.contextmanager
def file_path(final: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (),
              force: bool = True, is_ours: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a temp path beside ``final`` for a writer that opens files by name;
    rename it to ``final`` on success, remove it on any error. With ``force=False`` an
    existing file that ``is_ours`` does not recognise is refused first."""
    final = check_destination(final, inputs=inputs, force=force, is_ours=is_ours)
    with lock(final):
        clean_stale(final)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
        os.close(fd)
        tmp = Path(tmp)
        try:
            yield tmp
            tmp.chmod(0o644)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
