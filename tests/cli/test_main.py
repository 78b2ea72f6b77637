"""`cli.main`: EdgeError is caught once (message on stderr, its exit code); anything else is
a bug and keeps its traceback. Every user-facing error class derives from EdgeError."""

from __future__ import annotations

import pytest

from vllm_edge import cli
from vllm_edge.cli import doctor as doctor_cli
from vllm_edge.common.errors import EdgeError, UsageError


def test_edge_error_is_printed_once_with_its_exit_code(monkeypatch, capsys):
    def fails(args):
        raise EdgeError("the reason", exit_code=7)

    monkeypatch.setattr(doctor_cli, "run", fails)
    assert cli.main(["doctor"]) == 7
    captured = capsys.readouterr()
    assert captured.err == "error: the reason\n" and captured.out == ""

    def usage(args):
        raise UsageError("bad flag")

    monkeypatch.setattr(doctor_cli, "run", usage)
    assert cli.main(["doctor"]) == 2
    assert capsys.readouterr().err == "error: bad flag\n"


def test_other_exceptions_are_bugs(monkeypatch):
    def bug(args):
        raise KeyError("oops")

    monkeypatch.setattr(doctor_cli, "run", bug)
    with pytest.raises(KeyError):
        cli.main(["doctor"])


def test_user_facing_errors_derive_from_edge_error():
    from vllm_edge.bench.bandwidth import BandwidthError
    from vllm_edge.bench.bytes_per_token import AccountingError
    from vllm_edge.bench.grid.runner import EXIT_BUSY, EXIT_LOCKED, HostBusy, LockHeld, SpecError
    from vllm_edge.bench.profile import ProfileError
    from vllm_edge.bench.soak import SoakError
    from vllm_edge.bench.speed import SpeedArgError
    from vllm_edge.models.gguf_export import GgufExportError
    from vllm_edge.models.gguf_import import GgufImportError
    from vllm_edge.models.store import ModelNotAvailable
    from vllm_edge.quant.linear import CheckpointError
    from vllm_edge.runtime.images import ImageInputError
    from vllm_edge.serving.serve import ServeError

    classes = [BandwidthError, AccountingError, HostBusy, LockHeld, SpecError, ProfileError, SoakError,
               SpeedArgError, GgufExportError, GgufImportError, ModelNotAvailable, CheckpointError,
               ImageInputError, ServeError]
    assert [c.__name__ for c in classes if not issubclass(c, EdgeError)] == []
    # the bases callers catch stay
    for c in (BandwidthError, AccountingError, SpecError, CheckpointError, ImageInputError, SpeedArgError):
        assert issubclass(c, ValueError), c
    for c in (HostBusy, LockHeld, ProfileError):
        assert issubclass(c, RuntimeError), c
    assert (HostBusy.exit_code, LockHeld.exit_code, SpecError.exit_code) == (EXIT_BUSY, EXIT_LOCKED, 2)
    err = ImageInputError("too big", status=413)
    assert (str(err), err.status, err.exit_code) == ("too big", 413, 2)


def test_arguments_after_double_dash_are_only_for_serve(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["doctor", "--", "--foo"])
    assert exc.value.code == 2
    assert "only for `serve`" in capsys.readouterr().err


def test_a_real_error_through_python_m_is_one_line_without_a_traceback(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
               VLLM_EDGE_HOME=str(tmp_path / "home"))
    missing = tmp_path / "no-such-model"
    proc = subprocess.run([sys.executable, "-m", "vllm_edge.cli", "run", "--model", str(missing),
                           "--keep-alive", "0", "--prompt", "hi"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"error: {missing}: no such model directory, and not an embedded model name"], lines
