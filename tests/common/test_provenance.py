"""The commit a result records: dirty for a change to the code, not for the results a
benchmark writes over its own earlier artifact."""

from __future__ import annotations

import subprocess

from vllm_edge.common.provenance import RESULTS_DIR, repo_sha


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_results_do_not_dirty_the_commit_and_code_does(tmp_path):
    repo = tmp_path / "repo"
    pkg = repo / "src" / "pkg"
    results = repo / RESULTS_DIR / "grid"
    pkg.mkdir(parents=True)
    results.mkdir(parents=True)
    (pkg / "mod.py").write_text("x = 1\n")
    (results / "summary.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    sha = repo_sha(pkg)
    assert sha and len(sha) == 40
    (results / "summary.json").write_text('{"replaced": true}\n')  # a benchmark's own output
    assert repo_sha(pkg) == sha
    (pkg / "mod.py").write_text("x = 2\n")  # the code measured
    assert repo_sha(pkg) == sha + "-dirty"
