"""Safe writes: what a write refuses, how it swaps, what a killed writer leaves, and the lock."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from vllm_edge.common import atomic, manifest
from vllm_edge.common.atomic import DestinationError


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _build(out: Path, kind: str = "quantize", payload: str = "new", **kw) -> Path:
    with atomic.directory(out, kind=kind, **kw) as tmp:
        (tmp / "model.safetensors").write_text(payload)
        manifest.write(tmp, {"converter": f"{kind}/1"})
    return out


def test_refuses_a_foreign_directory_and_keeps_it(tmp_path):
    dst = tmp_path / "photos"
    dst.mkdir()
    (dst / "cat.jpg").write_bytes(b"\xff\xd8 not a model")
    before = _tree(dst)
    with pytest.raises(DestinationError, match=r"photos: exists and is a directory with 1 entries"):
        _build(dst)
    assert _tree(dst) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".photos.") and p.suffix == ".partial"]


def test_force_replaces_a_foreign_directory(tmp_path):
    dst = tmp_path / "old"
    dst.mkdir()
    (dst / "x").write_text("x")
    _build(dst, force=True)
    assert (dst / "model.safetensors").read_text() == "new" and not (dst / "x").exists()


@pytest.mark.parametrize("case", ["same", "inside", "contains"])
def test_never_writes_over_its_input_even_with_force(tmp_path, case):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_text("source weights")
    manifest.write(src, {"converter": "quantize/1"})  # even a build of the same kind
    dst = {"same": src, "inside": src / "out", "contains": tmp_path}[case]
    before = _tree(tmp_path)
    with pytest.raises(DestinationError, match={"same": "the input itself", "inside": "inside the input",
                                                "contains": "contains the input"}[case]):
        _build(dst, inputs=[src], force=True)
    assert _tree(tmp_path) == before


def test_a_file_input_inside_the_destination_is_refused(tmp_path):
    gguf = tmp_path / "models" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF....")
    with pytest.raises(DestinationError, match="contains the input"):
        _build(gguf.parent, kind="gguf-import", inputs=[gguf], force=True)
    assert gguf.read_bytes() == b"GGUF...."


def test_empty_directory_and_same_kind_are_replaced_other_kind_is_not(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    _build(dst, payload="one")
    _build(dst, payload="two")
    assert (dst / "model.safetensors").read_text() == "two"
    with pytest.raises(DestinationError, match="not a vllm-edge synthetic build"):
        _build(dst, kind="synthetic")
    assert (dst / "model.safetensors").read_text() == "two"


def test_unwritable_destination_fails_before_the_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ran = []
    with pytest.raises(DestinationError, match="cannot write in"):
        with atomic.directory(blocker / "out", kind="quantize"):
            ran.append(1)
    assert not ran


def test_manifest_lists_files_and_problem_finds_damage(tmp_path):
    out = _build(tmp_path / "m")
    data = manifest.read(out)
    assert data["files"]["model.safetensors"]["size"] == 3 and "sha256" in data["files"]["model.safetensors"]
    assert manifest.problem(out) is None
    (out / "model.safetensors").write_text("newer")
    assert "has 5 bytes" in manifest.problem(out)
    (out / "model.safetensors").write_text("xyz")  # same size, other content: the hash sees it
    assert "changed" in manifest.problem(out)
    (out / "model.safetensors").unlink()
    assert "model.safetensors is missing" in manifest.problem(out)
    assert "no vllm_edge_manifest.json" in manifest.problem(tmp_path / "nothing")
    assert manifest.mismatch(_build(tmp_path / "m2"), {"converter": "quantize/1"}) is None
    assert "built with converter" in manifest.mismatch(tmp_path / "m2", {"converter": "quantize/2"})


def test_swap_is_one_step_here(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "f").write_text("A")
    (b / "f").write_text("B")
    assert atomic.exchange(a, b), "renameat2(RENAME_EXCHANGE) is expected on this filesystem"
    assert (a / "f").read_text() == "B" and (b / "f").read_text() == "A"


def test_stale_leftovers_are_cleaned_and_a_half_swapped_build_restored(tmp_path):
    out = tmp_path / "m"
    (tmp_path / ".m.abc12_yz.partial").mkdir()  # tempfile's eight characters
    (tmp_path / ".m.xyz98765.partial").write_text("")
    (tmp_path / ".m.q1w2e3r4.probe").mkdir()
    old = tmp_path / ".m.old"
    old.mkdir()
    (old / "model.safetensors").write_text("old")
    atomic.clean_stale(out)
    assert (out / "model.safetensors").read_text() == "old"  # the build a killed swap moved aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_clean_stale_touches_only_its_own_names(tmp_path):
    """`quantize ... out` once removed a concurrent `out.v2` writer's temp dir and its
    `.old` copy, and a user's `.out.bak.old`: the glob `.out.*` matched them all."""
    out = tmp_path / "out"
    out.mkdir()
    keep = [".out.v2.abcd1234.partial", ".out.v2.old", ".out.bak.old", ".out.notes.partial",
            ".out.abcd1234.partial.bak", ".outx.abcd1234.partial", ".out.[x].old"]
    for name in keep:
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("theirs")
    mine = [".out.abcd1234.partial", ".out.zz_99xyz.probe", ".out.old"]
    for name in mine:
        (tmp_path / name).mkdir()
    removed = atomic.clean_stale(out)
    assert sorted(p.name for p in removed) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + ["out"])
    # a name with glob characters is taken literally
    odd = tmp_path / "m[1]"
    (tmp_path / ".m[1].old").mkdir()
    (tmp_path / ".m1.old").mkdir()
    atomic.clean_stale(odd)
    assert (odd).is_dir() and (tmp_path / ".m1.old").is_dir()


def test_a_concurrent_writer_of_a_longer_name_keeps_its_temp_dir(tmp_path):
    other = tmp_path / "out.v2"
    with atomic.directory(other, kind="quantize") as tmp:
        (tmp / "model.safetensors").write_text("v2")
        manifest.write(tmp, {"converter": "quantize/1"})
        _build(tmp_path / "out")  # cleans beside out, under its own lock
        assert tmp.is_dir(), "the out.v2 writer's temp dir was removed"
    assert (other / "model.safetensors").read_text() == "v2"


@pytest.mark.parametrize("force", [False, True])
def test_a_symlinked_destination_is_refused(tmp_path, force):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "f").write_text("keep")
    link = tmp_path / "out"
    link.symlink_to(target)
    with pytest.raises(DestinationError, match="symbolic link"):
        _build(link, force=force)
    assert _tree(target) == {"f": b"keep"} and link.is_symlink()


def _writer(out: str, counter: str, start: float) -> None:
    while time.time() < start:
        time.sleep(0.001)
    with atomic.lock(out):
        if manifest.mismatch(out, {"converter": "quantize/1"}) is None:
            return  # another writer made it: reuse
        with open(counter, "a") as f:
            f.write("built\n")
        with atomic.directory(out, kind="quantize") as tmp:
            time.sleep(0.2)
            (tmp / "model.safetensors").write_text("w")
            manifest.write(tmp, {"converter": "quantize/1"})


def test_concurrent_first_use_builds_once_and_leaves_no_litter(tmp_path):
    out, counter = tmp_path / "m", tmp_path / "count"
    start = time.time() + 0.5
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(out), str(counter), start)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert counter.read_text() == "built\n"
    assert manifest.problem(out) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "count", "m"]


def test_file_path_refuses_a_file_it_did_not_write(tmp_path):
    notes = tmp_path / "notes.gguf"
    notes.write_text("my notes")
    with pytest.raises(DestinationError, match="a file vllm-edge did not write"):
        with atomic.file_path(notes, force=False, is_ours=lambda p: False):
            pass
    assert notes.read_text() == "my notes"
    with atomic.file_path(notes, force=False, is_ours=lambda p: True) as tmp:
        tmp.write_text("ours")
    assert notes.read_text() == "ours"
    assert os.stat(notes).st_mode & 0o777 == 0o644
