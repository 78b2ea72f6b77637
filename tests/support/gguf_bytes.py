"""A GGUF file written byte by byte: a hostile one (tensors that share or reorder their data,
oversized metadata) that the gguf library would not write. Used by the fuzz tests and the
security probes."""

from __future__ import annotations

import struct


def handmade(tensors: list[tuple[str, int]], *, data: int = 128, meta: bytes = b"", n_meta: int = 0) -> bytes:
    """A GGUF v3 with general.architecture=llama, ``meta`` more metadata entries, and one-row
    f32 tensors of 32 values at the given data offsets."""

    def s(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1 + n_meta)
    head += s("general.architecture") + struct.pack("<I", 8) + s("llama") + meta
    for name, offset in tensors:
        head += s(name) + struct.pack("<IQIQ", 1, 32, 0, offset)
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * data
