"""A seeded fuzz of `models import-gguf`: a tiny llama GGUF that converts, mutated (cut anywhere or
inside its header, bytes changed in the header and in the tensor data, huge counts and lengths,
wrong magic, empty) and given to import_gguf, the function the command calls.

Each case either converts into a complete build (manifest.problem finds nothing) or raises
GgufImportError naming the file; never another exception, never past a deadline, never a
partial output beside the destination, and the input is byte-identical afterwards. The
targeted tests below are the cases the fuzz found, one per fix."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from support import fuzz
from support.checkpoints import no_partial_output, tiny_llama_gguf
from support.gguf_bytes import handmade
from vllm_edge.common import manifest
from vllm_edge.models.gguf_import import GgufImportError, import_gguf

SEED = 1729
CASES = 500
DEADLINE = 20.0  # seconds per case; a good case converts in well under one
# mutation -> weight: mostly header damage (where the parsing is), few data flips (each converts)
KINDS = {"cut": 4, "cut_header": 3, "flip_header": 6, "flip_data": 1, "huge": 3}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict:
    """The tiny GGUF's bytes, where its tensor data starts, and every integer field of its
    header (counts, lengths, types, dims, offsets) with its offset and width, and where each
    metadata value (an array's first element) starts. Converting it once proves it valid and
    pays transformers' import before the cases."""
    import gguf
    import numpy as np

    root = tmp_path_factory.mktemp("gguf_fuzz")
    src = tiny_llama_gguf(root / "tiny.gguf")
    with fuzz.deadline(300, "the pristine tiny GGUF"):
        out = import_gguf(src, root / "tiny", progress=False)
    assert manifest.problem(out) is None
    reader = gguf.GGUFReader(str(src))
    base = reader.data.ctypes.data
    ints = [(part.ctypes.data - base, "<Q" if part.dtype == np.uint64 else "<I", field.name)
            for field in [*reader.fields.values(), *(t.field for t in reader.tensors)]
            for part in field.parts if part.dtype in (np.uint64, np.uint32) and part.size == 1]
    return {"bytes": src.read_bytes(), "data_start": reader.data_offset, "ints": ints,
            "values": {k: f.parts[f.data[0]].ctypes.data - base for k, f in reader.fields.items()}}


def _cases(p: dict) -> list[tuple[str, bytes]]:
    good, start = p["bytes"], p["data_start"]
    rng = random.Random(SEED)
    cases = [("empty file", b""), ("wrong magic", b"GGML" + good[4:]),
             ("version 1", fuzz.put(good, 4, "<I", 1)),
             *((f"tensor count {v}", fuzz.put(good, 8, "<Q", v)) for v in fuzz.HUGE),
             *((f"metadata count {v}", fuzz.put(good, 16, "<Q", v)) for v in fuzz.HUGE)]
    kinds, weights = zip(*KINDS.items())
    for _ in range(CASES):
        kind = rng.choices(kinds, weights)[0]
        if kind == "cut":
            cases.append((kind, fuzz.truncate(good, rng)))
        elif kind == "cut_header":
            cases.append((kind, fuzz.truncate(good, rng, 0, start)))
        elif kind == "flip_header":
            cases.append((kind, fuzz.flip(good, rng, 4, start, n=rng.randint(1, 4))))
        elif kind == "flip_data":
            cases.append((kind, fuzz.flip(good, rng, start, n=rng.randint(1, 8))))
        else:
            offset, fmt, field = rng.choice(p["ints"])
            value = fuzz.huge(rng, 64 if fmt == "<Q" else 32)
            cases.append((f"huge {field} @{offset} = {value}", fuzz.put(good, offset, fmt, value)))
    return cases


def _run(src: Path, out: Path, what: str) -> tuple[str, str | None]:
    """("converted" or "refused", what broke the contract on this case or None)."""
    outcome, why = fuzz.judge_write(lambda: import_gguf(src, out, progress=False), src, out, what,
                                    deadline_s=DEADLINE, refused=GgufImportError, done="converted")
    if outcome == "broke":
        return outcome, why
    # nothing may appear beside the input but the output and its lock
    litter = {p.name for p in src.parent.iterdir()} - {src.name, out.name, f".{out.name}.lock"}
    return outcome, why or (f"left {sorted(litter)} beside the input" if litter else None)


# gguf warns when it dequantizes a block whose scale a flip made NaN
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_mutated_gguf_converts_or_is_refused_naming_the_file(pristine, tmp_path):
    failures, outcomes = [], Counter()
    cases = _cases(pristine)
    with fuzz.one_thread():
        for i, (what, blob) in enumerate(cases):
            case = tmp_path / f"case{i}"
            case.mkdir()
            src = case / "model.gguf"
            src.write_bytes(blob)
            outcome, why = _run(src, case / "out", f"case {i} ({what})")
            outcomes[outcome] += 1
            if why:
                failures.append(f"case {i} ({what}): {why}")
            shutil.rmtree(case)
    assert not failures, f"{len(failures)} of {len(cases)} cases broke the contract:\n" + "\n".join(failures)
    # both ends are reached: flipped data converts, broken headers are refused
    assert outcomes["converted"] >= 20 and outcomes["refused"] >= 300, outcomes


# --- what the fuzz found ---------------------------------------------------------------------


def _write(tmp_path: Path, blob: bytes) -> Path:
    src = tmp_path / "model.gguf"
    src.write_bytes(blob)
    return src


def _refused(src: Path, match: str) -> None:
    out = src.parent / "out"
    with fuzz.memory_cap(), fuzz.deadline(DEADLINE, src.name):
        with pytest.raises(GgufImportError, match=match) as e:
            import_gguf(src, out, progress=False)
    assert str(src) in str(e.value)
    assert no_partial_output(out)


def _replace(good: bytes, old: bytes, new: bytes) -> bytes:
    assert good.count(old) == 1 and len(old) == len(new)
    return good.replace(old, new)


def test_huge_array_count_in_a_cut_file_is_refused_at_once(pristine, tmp_path):
    # gguf's reader walked past the end without end here, its memory growing
    at = pristine["values"]["tokenizer.ggml.token_type"] - 8  # the count before the values
    blob = fuzz.put(pristine["bytes"], at, "<Q", 2**32 - 1)[: at + 8 + 40]
    _refused(_write(tmp_path, blob), r"truncated GGUF: metadata tokenizer.ggml.token_type "
                                     r"\(4294967295 values\) at byte \d+ needs 17179869180 bytes")


def test_a_string_that_is_not_utf8_names_its_key(pristine, tmp_path):
    # was UnicodeDecodeError from transformers' reader
    blob = fuzz.put(pristine["bytes"], pristine["values"]["tokenizer.chat_template"], "<B", 0xFF)
    _refused(_write(tmp_path, blob), "metadata tokenizer.chat_template is not valid UTF-8")


@pytest.mark.parametrize("layers", [2**32 - 1, 2])
def test_a_layer_count_the_tensors_do_not_have_is_refused(pristine, tmp_path, layers):
    # 2**32-1 had transformers build that many layers (a hang, memory growing); 2 converted
    # "successfully" with the second layer left at its random initial values
    blob = fuzz.put(pristine["bytes"], pristine["values"]["llama.block_count"], "<I", layers)
    _refused(_write(tmp_path, blob),
             rf"llama.block_count={layers}, but the file has tensors for layers \[0\]")


@pytest.mark.parametrize("key, value, match", [
    # was ValueError (cannot reshape) from transformers' Q/K permutation
    ("llama.attention.head_count_kv", 2**31, "attention.head_count_kv=2147483648: the heads must divide"),
    # was StrictDataclassClassValidationError from transformers' config
    ("llama.attention.head_count", 2**24, "attention.head_count=16777216, .*: the heads must divide"),
    ("llama.rope.dimension_count", 2**32 - 1, r"tensor blk.0.attn_q.weight has shape \[32, 32\], but the "
                                              r"metadata makes it \[32, 17179869180\]"),
    # was IndexError from transformers' tokenizer
    ("tokenizer.ggml.bos_token_id", 2**24, "tokenizer.ggml.bos_token_id=16777216 is not a token id"),
])
def test_a_hyperparameter_that_disagrees_with_the_file_is_named(pristine, tmp_path, key, value, match):
    blob = fuzz.put(pristine["bytes"], pristine["values"][key], "<I", value)
    _refused(_write(tmp_path, blob), match)


def test_a_renamed_tensor_is_missing_not_random(pristine, tmp_path):
    # converted "successfully" with ffn_up left at its random initial values
    blob = _replace(pristine["bytes"], b"blk.0.ffn_up.weight", b"blk.0.ffn_uq.weight")
    _refused(_write(tmp_path, blob), "missing tensor blk.0.ffn_up.weight")


@pytest.mark.parametrize("old, new, match", [
    (b"tokenizer.ggml.tokens", b"tokenizer.ggml.tokenz", "tokenizer.ggml.tokens is missing"),  # KeyError
    (b"gpt2", b"gpz2", r"transformers cannot read its tokenizer \(ValueError: .*'gpz2'"),  # ValueError
    (b"tokenizer.ggml.merges", b"tokenizer.ggml.mergez",
     r"transformers cannot read its tokenizer \(KeyError: 'scores'\)"),  # KeyError
])
def test_a_tokenizer_transformers_cannot_build_names_the_file(pristine, tmp_path, old, new, match):
    _refused(_write(tmp_path, _replace(pristine["bytes"], old, new)), match)


def test_tensors_that_share_data_are_refused_naming_one(tmp_path):
    """3000 tensors on block 0's data passed every check and the import built ~100x the model."""
    from vllm_edge.models.gguf_import import inspect_gguf

    src = _write(tmp_path, handmade([(f"blk.{i}.w", 0) for i in range(3000)]))
    with pytest.raises(GgufImportError, match=r"tensor blk\.1\.w's data \(at offset 0\) overlaps "
                                              r"or comes before the data of blk\.0\.w"):
        inspect_gguf(src)
    src = _write(tmp_path, handmade([("a", 128), ("b", 0)], data=256))  # out of order
    with pytest.raises(GgufImportError, match=r"tensor b's data"):
        inspect_gguf(src)
    assert inspect_gguf(_write(tmp_path, handmade([("a", 0), ("b", 128)], data=256))).tensor_count == 2


def test_metadata_is_capped_by_its_cost_in_memory(tmp_path):
    """A uint8 array is one byte a value on disk and ~40 in a Python list."""
    import struct

    from vllm_edge.models.gguf_import import MAX_METADATA_MEMORY, inspect_gguf

    count = MAX_METADATA_MEMORY // 32
    meta = (struct.pack("<Q", 5) + b"x.big" + struct.pack("<IIQ", 9, 0, count) + b"\0" * count)
    src = _write(tmp_path, handmade([], meta=meta, n_meta=1))
    with pytest.raises(GgufImportError, match=r"metadata x\.big .* over 256 MiB of memory"):
        inspect_gguf(src)
