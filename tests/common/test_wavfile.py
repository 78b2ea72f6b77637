"""speak's WAV files: valid for the stdlib reader, marked as ours, sizes set on close."""

from __future__ import annotations

import struct
import wave

from vllm_edge.common import wavfile


def test_a_closed_file_reads_back_and_is_ours(tmp_path):
    path = tmp_path / "a.wav"
    pcm = struct.pack("<4h", 0, 1000, -1000, 32767)
    with open(path, "wb") as f:
        w = wavfile.Writer(f, 24000)
        w.write(pcm[:3])  # a chunk may split a sample
        w.write(pcm[3:])
        w.close()
    with wave.open(str(path), "rb") as r:
        assert (r.getframerate(), r.getnchannels(), r.getsampwidth(), r.getnframes()) == (24000, 1, 2, 4)
        assert r.readframes(4) == pcm
    assert wavfile.written_by_us(path)


def test_other_files_are_not_ours(tmp_path):
    plain = tmp_path / "plain.wav"
    with wave.open(str(plain), "wb") as w:  # a WAV someone else wrote
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 10)
    text = tmp_path / "notes.wav"
    text.write_text("not audio")
    forged = tmp_path / "forged.wav"
    forged.write_bytes(wavfile.header(24000, 0).replace(wavfile.SOFTWARE, b"other software!"))
    assert not any(wavfile.written_by_us(p) for p in (plain, text, forged, tmp_path / "missing.wav"))


def test_a_file_cut_short_still_names_its_writer(tmp_path):
    path = tmp_path / "cut.wav"
    with open(path, "wb") as f:  # killed before close: sizes still "unknown"
        wavfile.Writer(f, 24000).write(b"\1\0" * 8)
    assert wavfile.written_by_us(path)
    assert wavfile.chunks(path)[b"data"] == b"\1\0" * 8
