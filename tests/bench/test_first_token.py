"""bench first-token: argument errors before any server work."""

from __future__ import annotations

from support.cli_runner import run_cli


def test_passes_must_be_positive(tmp_path):
    proc = run_cli("bench", "first-token", "--passes", "0", "--out", str(tmp_path / "o.json"),
                   timeout=120)
    assert proc.returncode == 2 and "--passes 0: must be at least 1" in proc.stderr
    assert not (tmp_path / "o.json").exists()
