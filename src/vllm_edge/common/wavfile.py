"""16-bit PCM WAV files that say who wrote them.

`speak` writes audio as it arrives and must never overwrite a file it did not write. Its files
carry a RIFF ``LIST/INFO`` chunk whose ``ISFT`` (software) field is :data:`SOFTWARE`, which
players ignore and :func:`written_by_us` reads back. The sizes in the header are written as
"unknown" first and set when the file is closed, so a file cut short by a kill still plays up
to where it stopped.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

SOFTWARE = b"vllm-edge speak"
UNKNOWN = 0xFFFFFFFF


def _info_chunk() -> bytes:
    text = SOFTWARE + b"\0" * (2 - len(SOFTWARE) % 2)  # NUL-terminated, padded to even
    isft = b"ISFT" + struct.pack("<I", len(text)) + text
    return b"LIST" + struct.pack("<I", 4 + len(isft)) + b"INFO" + isft


def header(sample_rate: int, data_bytes: int | None = None, channels: int = 1) -> bytes:
    """RIFF, fmt, our LIST/INFO and the data chunk's header; sizes unknown when ``data_bytes``
    is None (a stream)."""
    block = 2 * channels
    info = _info_chunk()
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
    riff = UNKNOWN if data_bytes is None else 4 + len(fmt) + len(info) + 8 + data_bytes
    data = UNKNOWN if data_bytes is None else data_bytes
    return b"RIFF" + struct.pack("<I", riff) + b"WAVE" + fmt + info + b"data" + struct.pack("<I", data)


class Writer:
    """PCM16 bytes to a seekable file: the header first, the samples as they come, the sizes on
    :meth:`close`."""

    def __init__(self, f: BinaryIO, sample_rate: int, channels: int = 1) -> None:
        self.f, self.sample_rate, self.channels = f, sample_rate, channels
        self.data_bytes = 0
        f.write(header(sample_rate, None, channels))

    def write(self, pcm: bytes) -> None:
        self.f.write(pcm)
        self.data_bytes += len(pcm)

    def close(self) -> None:
        if self.data_bytes % 2:  # RIFF chunks are word-aligned
            self.f.write(b"\0")
        self.f.seek(0)
        self.f.write(header(self.sample_rate, self.data_bytes, self.channels))
        self.f.seek(0, 2)
        self.f.flush()


def chunks(path) -> dict[bytes, bytes]:
    """A RIFF/WAVE file's top-level chunks (id -> payload; the data chunk's payload is cut to
    its first bytes), or {} for anything else."""
    out: dict[bytes, bytes] = {}
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:] != b"WAVE":
                return {}
            while True:
                ck = f.read(8)
                if len(ck) < 8:
                    return out
                cid, size = ck[:4], struct.unpack("<I", ck[4:])[0]
                if cid == b"data":
                    out[cid] = f.read(min(size, 64))
                    return out
                out[cid] = f.read(size + size % 2)
    except OSError:
        return {}


def written_by_us(path) -> bool:
    """Whether ``path`` is a WAV file `speak` wrote (its LIST/INFO names us)."""
    info = chunks(path).get(b"LIST", b"")
    if not info.startswith(b"INFO"):
        return False
    pos = 4
    while pos + 8 <= len(info):
        cid, size = info[pos:pos + 4], struct.unpack("<I", info[pos + 4:pos + 8])[0]
        if cid == b"ISFT":
            return info[pos + 8:pos + 8 + size].rstrip(b"\0") == SOFTWARE
        pos += 8 + size + size % 2
    return False
