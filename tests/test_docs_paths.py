"""No machine paths in what ships: README, CHANGELOG, every page under docs/ and benchmarks/,
and every text file under src/ (Python sources and package data) name no directory of the host
they were written on (a temp dir, a home, a checkout). An example path in a doc reads as
relative (``../old-checkout/src``) or as a placeholder.

The one exception, :data:`ALLOWED`, is a fixed path the product itself uses, each with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Built from pieces so that a reader grepping for them finds the checker, not a hit.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:" + "|".join(("tmp", "work", "home", "root", "Users")) + r")/")
TEXT_SUFFIXES = {".py", ".md", ".json", ".jinja", ".txt", ".c", ".cpp", ".h", ".sh", ".toml", ".yaml", ".cfg"}

# (file relative to the repository, the exact text on the line) -> why the path is the product's.
ALLOWED = {
    ("src/vllm_edge/bench/grid/runner.py", 'DEFAULT_LOCK = Path("/' + 'tmp/vllm-edge-bench.lock")'):
        "the host-wide benchmark lock: every harness run on the host must find the same file "
        "whatever its TMPDIR says, so it is a fixed path (`grid --lock-file` names another)",
}


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line naming a machine path."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if MACHINE_PATH.search(line)]


def _checked_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "CHANGELOG.md"]
    files += sorted((REPO / "docs").rglob("*.md")) + sorted((REPO / "benchmarks").rglob("*.md"))
    files += sorted(p for p in (REPO / "src").rglob("*")
                    if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts)
    return files


def _hits() -> list[tuple[str, int, str]]:
    out = []
    for path in _checked_files():
        rel = str(path.relative_to(REPO))
        for n, line in machine_paths(path.read_text(errors="replace")):
            out.append((rel, n, line.strip()))
    return out


def test_the_check_can_fail():
    for bad in ("PYTHONPATH=/" "tmp/wt-b0d667f/src", "see /" "work/shared/notes.md",
                "model_root: /" "root/.cache/vllm-edge/models/x", "`/" "home/me/llama`",
                "open('/" "Users/me/x.gguf')", "(/" "tmp/diag.py)"):
        assert machine_paths(bad), bad
    for good in ("~/.cache/vllm-edge", "../old-checkout/src", "$VLLM_EDGE_HOME/logs/", "/proc/stat",
                 "benchmarks/results/tmp/x.json", "a/tmp/b", "/dev/shm", "https://example.com/home/x"):
        assert not machine_paths(good), good


def test_no_machine_paths_in_docs_or_sources():
    assert (REPO / "CHANGELOG.md").is_file() and (REPO / "docs" / "README.md").is_file()
    bad = [f"{rel}:{n}: {line[:140]}" for rel, n, line in _hits() if (rel, line) not in ALLOWED]
    assert not bad, "machine paths (say what the path stands for instead):\n" + "\n".join(bad)


def test_every_allowed_path_is_still_there():
    hits = {(rel, line) for rel, _, line in _hits()}
    stale = [k for k in ALLOWED if k not in hits]
    assert not stale, f"allowed machine paths no longer found (drop them from ALLOWED): {stale}"
