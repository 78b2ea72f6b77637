"""A seeded fuzz of what `vllm-edge quantize` reads: a tiny bf16 llama directory whose
model.safetensors (cut anywhere, bytes changed in its 8-byte header length, its JSON header and
its data, header entries edited: dtypes, shapes, data offsets) or config.json (bytes changed,
fields dropped or given values of the wrong type, nested past the parser's stack) is mutated,
then given to quantize_model, the function the command calls.

Each case either writes a complete build (manifest.problem finds nothing) or raises an EdgeError
naming the file; never another exception, never past a deadline, never a partial output beside
the destination, and the source directory is byte-identical afterwards. The targeted tests below
are the cases the fuzz found, one per fix."""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest

from support import fuzz
from support.checkpoints import no_partial_output, tiny_llama_dir
from vllm_edge.common import manifest
from vllm_edge.common.errors import EdgeError
from vllm_edge.quant.quantize import QuantizeError, quantize_model

SEED = 4099
CASES = 400
DEADLINE = 20.0  # seconds per case; a good case quantizes in a few hundredths
WEIGHTS, CONFIG = "model.safetensors", "config.json"
KINDS = {"cut": 3, "length": 2, "header_bytes": 3, "header_entry": 6, "data_bytes": 1,
         "config_bytes": 2, "config_field": 4}
# safetensors dtypes with their sizes (a retyped entry keeps its byte count), and names that are none
DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
          "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}
NOT_DTYPES = ["F4", "C64", "XX", "", "bf16", 7, None, ["BF16"]]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The tiny source directory; quantizing it once proves it valid."""
    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("st_fuzz")
    src = tiny_llama_dir(root / "src")
    assert manifest.problem(quantize_model(src, root / "q", progress=False)) is None
    return src


def _split(st: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", st[:8])[0]
    return json.loads(st[8:8 + n]), st[8 + n:]


def _join(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the writer's padding, so only the edit differs
    return struct.pack("<Q", len(raw)) + raw + data


def _edit_entry(st: bytes, rng: random.Random) -> tuple[str, bytes]:
    header, data = _split(st)
    name = rng.choice([k for k in header if k != "__metadata__"])
    entry = header[name]
    begin, end = entry["data_offsets"]
    edit = rng.choice(["dtype", "retype", "retype", "shape", "reshape", "offsets", "drop", "rename",
                       "metadata", "extra"])
    if edit == "dtype":
        entry["dtype"] = rng.choice(NOT_DTYPES + list(DTYPES))
    elif edit == "retype":  # another dtype over the same bytes: the header stays consistent
        dtype = rng.choice([d for d, size in DTYPES.items() if (end - begin) % size == 0])
        numel, rows = (end - begin) // DTYPES[dtype], entry["shape"][0]
        entry["dtype"], entry["shape"] = dtype, [rows, numel // rows] if numel % rows == 0 else [numel]
    elif edit == "shape":
        entry["shape"] = rng.choice([[], [0], [0, 128], [-1, 128], [2**40, 2**40], [2**64], "x", [1.5, 2],
                                     None, [128]])
    elif edit == "reshape":  # the same element count in other dimensions
        numel, dims = math.prod(entry["shape"]), []
        for _ in range(rng.randint(0, 3)):
            dims.append(rng.choice([d for d in (1, 2, 4, 16, 64, 128, 256)
                                    if numel % (d * math.prod(dims)) == 0]))
        entry["shape"] = [*dims, numel // math.prod(dims)]
    elif edit == "offsets":
        entry["data_offsets"] = rng.choice([[end, begin], [begin, len(data) + 64], [0, 2**63], [begin, begin],
                                            [-8, end], ["a", 1], [begin], None, [0, end - begin]])
    elif edit == "drop":
        del entry[rng.choice(["dtype", "shape", "data_offsets"])]
    elif edit == "rename":
        header[rng.choice(["", "../" + name, name.upper(), "lm_head.weight"])] = header.pop(name)
    elif edit == "metadata":
        header["__metadata__"] = rng.choice([{"format": 5}, "x", [1], {"format": "pt", "a": {"b": 1}}, None])
    else:
        entry[rng.choice(["extra", "dtype "])] = fuzz.junk(rng)
    return f"{edit} {name}", _join(header, data)


def _edit_config(cfg: bytes, rng: random.Random) -> tuple[str, bytes]:
    config = json.loads(cfg)
    edit = rng.choice(["drop", "wrong type", "text_config", "vision_config", "quantization_config",
                       "architectures"])
    if edit == "drop":
        key = rng.choice(list(config))
        del config[key]
    elif edit == "wrong type":
        key = rng.choice(list(config))
        config[key] = fuzz.junk(rng)
    else:
        key = edit
        config[key] = rng.choice([fuzz.junk(rng), ["LlamaForCausalLM", 5], [["LlamaForCausalLM"]],
                                  {"tie_word_embeddings": "no"}, {}])
    return edit if key == edit else f"{edit} {key}", json.dumps(config).encode()


def _cases(src: Path) -> list[tuple[str, str, bytes]]:
    """(what, file, its mutated bytes)."""
    st, cfg = (src / WEIGHTS).read_bytes(), (src / CONFIG).read_bytes()
    n_header = struct.unpack("<Q", st[:8])[0]
    cases = [("empty weights", WEIGHTS, b""), ("empty config", CONFIG, b""),
             ("deeply nested config", CONFIG, fuzz.deep()), ("config not UTF-8", CONFIG, b"\xff" + cfg[1:]),
             *((f"config is {v!r}", CONFIG, json.dumps(v).encode()) for v in ([], 1, "x", None)),
             *((f"header length {v}", WEIGHTS, fuzz.put(st, 0, "<Q", v)) for v in fuzz.HUGE)]
    rng = random.Random(SEED)
    kinds, weights = zip(*KINDS.items())
    for _ in range(CASES):
        kind = rng.choices(kinds, weights)[0]
        if kind == "cut":
            cases.append((kind, WEIGHTS, fuzz.truncate(st, rng)))
        elif kind == "length":
            cases.append((kind, WEIGHTS, fuzz.flip(st, rng, 0, 8)))
        elif kind == "header_bytes":
            cases.append((kind, WEIGHTS, fuzz.flip(st, rng, 8, 8 + n_header, n=rng.randint(1, 3))))
        elif kind == "header_entry":
            what, blob = _edit_entry(st, rng)
            cases.append((f"{kind}: {what}", WEIGHTS, blob))
        elif kind == "data_bytes":
            cases.append((kind, WEIGHTS, fuzz.flip(st, rng, 8 + n_header, n=rng.randint(1, 8))))
        elif kind == "config_bytes":
            cases.append((kind, CONFIG, fuzz.flip(cfg, rng, n=rng.randint(1, 6))))
        else:
            what, blob = _edit_config(cfg, rng)
            cases.append((f"{kind}: {what}", CONFIG, blob))
    return cases


def _run(src: Path, out: Path, what: str) -> tuple[str, str | None]:
    """("quantized" or "refused", what broke the contract on this case or None)."""
    return fuzz.judge_write(lambda: quantize_model(src, out, progress=False), src, out, what,
                            deadline_s=DEADLINE, refused=EdgeError, done="quantized")


def test_mutated_source_quantizes_or_is_refused_naming_the_file(pristine, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(pristine, src)
    failures, outcomes = [], Counter()
    cases = _cases(pristine)
    with fuzz.one_thread():
        for i, (what, file, blob) in enumerate(cases):
            (src / file).write_bytes(blob)
            out = tmp_path / f"out{i}"
            outcome, why = _run(src, out, f"case {i} ({what})")
            outcomes[outcome] += 1
            shutil.rmtree(out, ignore_errors=True)
            # nothing may appear beside the source but the output and its lock
            litter = [p.name for p in tmp_path.iterdir()
                      if p.name != "src" and not (p.name.startswith(".out") and p.name.endswith(".lock"))]
            if why or litter:
                failures.append(f"case {i} ({file}: {what}): {why or f'left {sorted(litter)}'}")
            shutil.copy(pristine / file, src / file)
    assert not failures, f"{len(failures)} of {len(cases)} cases broke the contract:\n" + "\n".join(failures)
    # both ends are reached: retyped entries and flipped data quantize, broken files are refused
    assert outcomes["quantized"] >= 50 and outcomes["refused"] >= 200, outcomes


# --- what the fuzz found ---------------------------------------------------------------------


def _refused(pristine: Path, tmp_path: Path, config: bytes, match: str) -> None:
    src = tmp_path / "src"
    shutil.copytree(pristine, src)
    (src / CONFIG).write_bytes(config)
    before = fuzz.snapshot(src)
    with pytest.raises(QuantizeError, match=match):
        quantize_model(src, tmp_path / "out", progress=False)
    assert no_partial_output(tmp_path / "out")
    assert fuzz.snapshot(src) == before


def test_a_config_nested_past_the_parser_stack_is_not_valid_json(pristine, tmp_path):
    # was RecursionError from json.loads
    _refused(pristine, tmp_path, fuzz.deep(), r"config.json: nested deeper than 64 levels")


@pytest.mark.parametrize("value", ["x", None, [], 1])
def test_a_text_config_that_is_not_an_object_is_named(pristine, tmp_path, value):
    # was AttributeError ('str' object has no attribute 'get')
    config = {**json.loads((pristine / CONFIG).read_text()), "text_config": value}
    _refused(pristine, tmp_path, json.dumps(config).encode(),
             rf"config.json: field text_config={value!r}; expected a JSON object".replace("[", r"\["))
