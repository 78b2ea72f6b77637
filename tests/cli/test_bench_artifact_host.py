"""A bench run never replaces an artifact another host measured: refused before any measuring,
by name, with a file of this host's to use instead; this host's own file, a new file and a
folder are left to the bench."""

from __future__ import annotations

import json
import os

import pytest

from vllm_edge.bench import compare
from vllm_edge.cli.bench import refuse_other_hosts_artifact
from vllm_edge.cli import main
from vllm_edge.common import provenance
from vllm_edge.common.errors import UsageError

OTHER = {"cpu": {"model": "Some Other CPU", "arch": "x86_64", "isa": {"avx2": True}}, "core_set": [0, 1]}


def _artifact(path, prov):
    path.write_text(json.dumps({"benchmark": "x", "provenance": prov}))
    return path


def test_another_hosts_artifact_is_refused_and_this_hosts_is_not(tmp_path):
    theirs = _artifact(tmp_path / "server_start.json", OTHER)
    before = theirs.read_text()
    with pytest.raises(UsageError, match=r"server_start\.json holds a measurement on Some Other CPU, "
                                         r"AVX2, 2 cores.*never replaced.*--out") as err:
        refuse_other_hosts_artifact(str(theirs))
    assert str(tmp_path / "server_start" / compare.host_slug(compare.this_host())) in str(err.value)
    assert theirs.read_text() == before
    ours = _artifact(tmp_path / "ours.json", {**provenance.collect(), "core_set": sorted(os.sched_getaffinity(0))})
    assert compare.other_host(ours) is None
    refuse_other_hosts_artifact(str(ours))
    refuse_other_hosts_artifact(str(tmp_path / "new.json"))  # nothing there yet
    refuse_other_hosts_artifact(str(tmp_path))  # a folder: per-host already
    refuse_other_hosts_artifact(None)


def test_the_cli_refuses_before_measuring(tmp_path, capsys):
    theirs = _artifact(tmp_path / "ledger.json", OTHER)
    # bench ledger would start an engine: the refusal comes first, and names the file
    assert main(["bench", "ledger", "--out", str(theirs)]) == UsageError.exit_code
    assert "ledger.json holds a measurement on Some Other CPU" in capsys.readouterr().err


def test_benches_that_default_to_a_file_default_to_this_hosts():
    from vllm_edge.bench import npu

    assert npu.default_out() == compare.host_artifact("benchmarks/results/npu")
    assert compare.host_artifact("benchmarks/results/sampling").name == \
        compare.host_slug(compare.this_host()) + ".json"
