"""A bench run never replaces an artifact another host measured: refused before any measuring,
by name, with a file of this host's to use instead; this host's own file, a new file and a
folder are left to the bench."""

from __future__ import annotations

import json
import os

import pytest

from vllm_edge.bench import compare
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
        compare.refuse_other_hosts_file(str(theirs))
    assert str(tmp_path / "server_start" / compare.host_slug(compare.this_host())) in str(err.value)
    assert theirs.read_text() == before
    here = {**provenance.collect(), "core_set": sorted(os.sched_getaffinity(0))}
    ours = _artifact(tmp_path / "ours.json", here)
    assert compare.recorded_host(ours.parent, ours.name) == compare.this_host()
    compare.refuse_other_hosts_file(str(ours))
    compare.refuse_other_hosts_file(str(tmp_path / "new.json"))  # nothing there yet
    compare.refuse_other_hosts_file(str(tmp_path))  # a folder: per-host already
    compare.refuse_other_hosts_file(None)


def test_the_cli_refuses_before_measuring(tmp_path, capsys):
    theirs = _artifact(tmp_path / "ledger.json", OTHER)
    # bench ledger would start an engine: the refusal comes first, and names the file
    assert main(["bench", "ledger", "--out", str(theirs)]) == UsageError.exit_code
    assert "ledger.json holds a measurement on Some Other CPU" in capsys.readouterr().err


def test_a_bench_that_names_its_own_default_file_checks_it_too(tmp_path, monkeypatch):
    from vllm_edge.bench.micro import int4

    theirs = _artifact(tmp_path / "cpu_int4_microbench.json", OTHER)
    monkeypatch.setattr(int4, "default_out", lambda set_name: str(theirs))
    monkeypatch.setattr(int4, "run", lambda **kw: pytest.fail("measured before the check"))
    with pytest.raises(UsageError, match="holds a measurement on Some Other CPU"):
        int4.main()


def test_benches_that_default_to_a_file_default_to_this_hosts():
    from vllm_edge.bench import npu

    assert npu.default_out() == compare.host_artifact("benchmarks/results/npu")
    assert compare.host_artifact("benchmarks/results/sampling").name == \
        compare.host_slug(compare.this_host()) + ".json"
