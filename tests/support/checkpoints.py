"""Checkpoints made on the spot (a copy of a model directory without its weights, a tiny GGUF
file of any architecture), and the check that a failed write left nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

WEIGHTS = "model.safetensors"


def copy_without_weights(src: Path, dst: Path) -> Path:
    """``dst`` (created) with every file of ``src`` but its weights (config, tokenizer, ...)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != WEIGHTS:
            shutil.copy(f, dst / f.name)
    return dst


def no_partial_output(out: Path) -> bool:
    """Neither ``out`` nor a temporary ``.{out.name}.*`` sibling (the atomic writers' staging
    directory) exists: a failed conversion left nothing behind. The writer's lock file
    (``.{out.name}.lock``, empty) is allowed to stay, as lock files do."""
    return not out.exists() and not any(p.name.startswith(f".{out.name}.") and p.name != f".{out.name}.lock"
                                        for p in out.parent.iterdir())


def tiny_gguf(path: Path, arch: str) -> Path:
    """A GGUF file declaring ``arch`` with one 4x8 zero tensor (enough to be refused)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
