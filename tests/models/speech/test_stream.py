"""Streaming the codec: chunk sizes, streamed audio against one offline decode, batching of
concurrent streams, and the WAV writer."""

from __future__ import annotations

import asyncio
import io
import threading
import wave

import pytest
import torch

from vllm_edge.models.speech import stream as stream_mod
from vllm_edge.models.speech.stream import (
    NO_RAMP,
    UNKNOWN_SIZE,
    DecoderClient,
    RampSchedule,
    StatefulDecoder,
    WavStreamWriter,
    boundary_error,
    decode_streamed,
    decode_with_left_context,
    to_pcm16,
)

BOUND = 1e-4  # of the offline peak


# --- the ramp ------------------------------------------------------------------------------------

def test_default_ramp_sizes():
    s = RampSchedule()
    sizes = s.sizes()
    assert [next(sizes) for _ in range(8)] == [1, 2, 4, 8, 16, 25, 25, 25]
    assert s.chunks(40) == [(0, 1), (1, 3), (3, 7), (7, 15), (15, 31), (31, 40)]
    assert NO_RAMP.chunks(60) == [(0, 25), (25, 50), (50, 60)]


def test_ramp_by_fixed_step():
    sizes = RampSchedule(first_frames=2, growth=1, step=3, steady_frames=10).sizes()
    assert [next(sizes) for _ in range(6)] == [2, 5, 8, 10, 10, 10]


@pytest.mark.parametrize("kwargs", [{"first_frames": 0}, {"first_frames": 30}, {"growth": 0.5},
                                    {"growth": 1, "step": 0}, {"left_context": -1}])
def test_ramp_rejects(kwargs):
    with pytest.raises(ValueError):
        RampSchedule(**kwargs)


# --- streamed against offline --------------------------------------------------------------------

@pytest.mark.parametrize("schedule", [RampSchedule(), NO_RAMP,
                                      RampSchedule(first_frames=1, growth=1, step=1, steady_frames=5)])
def test_stateful_equals_offline_small(small, codes_for, schedule):
    """60 frames: past the 16-step window (8 frames), so the kept keys are trimmed many times."""
    codes = codes_for(small, 2, 60)
    err = boundary_error(decode_streamed(small, codes, schedule), small.decode(codes))
    assert err.max_rel < BOUND and err.snr_db > 100


def test_stateful_equals_offline_real_shapes(mimi, codes_for):
    """Mimi's shapes, default ramp, 130 frames: past the 250-step window (125 frames)."""
    codes = codes_for(mimi, 1, 130)
    err = boundary_error(decode_streamed(mimi, codes), mimi.decode(codes))
    assert err.max_rel < BOUND


def test_transformers_cache_alone_is_not_enough(small, codes_for):
    """decode() chunk by chunk with only its decoder_past_key_values: the SEANet convs start
    from zeros at every chunk, so the audio breaks at the boundaries."""
    from transformers import DynamicCache

    codes = codes_for(small, 1, 40)
    cache, out = DynamicCache(config=small.model.config), []
    with torch.inference_mode():
        for a, b in RampSchedule().chunks(40):
            audio, cache = small.model.decode(codes[:, :, a:b], decoder_past_key_values=cache,
                                              return_dict=False)
            out.append(audio[:, 0])
    assert boundary_error(out, small.decode(codes)).max_rel > 100 * BOUND


def test_left_context_route(small, codes_for):
    """Stateless chunks are exact once the context covers the receptive field (21 frames
    here), and a context shorter than the conv history (6 frames) fails the bound by far."""
    codes = codes_for(small, 1, 60)
    offline = small.decode(codes)
    full = small.facts.receptive_field_frames
    assert boundary_error(decode_with_left_context(small, codes, left_context=full), offline).max_rel < BOUND
    short = boundary_error(decode_with_left_context(small, codes, left_context=2), offline)
    assert short.max_rel > 100 * BOUND and short.snr_db < 40


def test_left_context_real_shapes(mimi, codes_for):
    """Mimi's shapes: the default context (125 frames) holds the bound at a boundary 130 frames
    in, where it does not reach the start; 4 frames, short of the 5-frame conv history, fail
    it by far. (Two chunks, so it stays fast: each chunk decodes its context again.)"""
    codes = codes_for(mimi, 1, 140)
    offline = mimi.decode(codes)
    two = RampSchedule(first_frames=130, steady_frames=130)
    assert two.chunks(140) == [(0, 130), (130, 140)] and 130 > two.left_context
    assert boundary_error(decode_with_left_context(mimi, codes, two), offline).max_rel < BOUND
    short = boundary_error(decode_with_left_context(mimi, codes, two, left_context=4), offline)
    assert short.max_rel > 100 * BOUND and short.snr_db < 40


def test_gemm_transposed_conv(small, codes_for, monkeypatch):
    """The GEMM path of the transposed convs: against torch's own, a kernel that is not a
    multiple of the stride included, and through the small codec's stream."""
    conv = torch.nn.ConvTranspose1d(6, 5, kernel_size=7, stride=3)
    x = torch.randn(2, 6, 9)
    monkeypatch.setattr(stream_mod, "GEMM_CONVTR_MIN_WEIGHTS", 0)
    with torch.inference_mode():
        torch.testing.assert_close(stream_mod._conv_transpose(conv, x), conv(x), rtol=0, atol=1e-6)
    codes = codes_for(small, 1, 30)
    assert boundary_error(decode_streamed(small, codes), small.decode(codes)).max_rel < BOUND


def test_batch_with_different_histories(small, codes_for):
    """Two streams in one call, one 10 frames ahead (its keys left-padded for the other)."""
    codes = codes_for(small, 2, 40)
    offline = small.decode(codes)
    dec = StatefulDecoder(small)
    a, b = dec.new_state(), dec.new_state()
    out_a, out_b = [dec.decode([a], codes[:1, :, :10])], []
    for start in range(0, 30, 5):
        chunk = torch.cat([codes[:1, :, 10 + start:15 + start], codes[1:, :, start:start + 5]])
        both = dec.decode([a, b], chunk)
        out_a.append(both[:1])
        out_b.append(both[1:])
    out_b.append(dec.decode([b], codes[1:, :, 30:]))
    assert boundary_error(torch.cat(out_a, -1)[0], offline[0]).max_rel < BOUND
    assert boundary_error(torch.cat(out_b, -1)[0], offline[1]).max_rel < BOUND


# --- the client ----------------------------------------------------------------------------------

def test_client_batches_two_streams(small, codes_for):
    """Two streams' chunks decoded together give each stream the audio it gets alone."""
    codes = codes_for(small, 2, 45, seed=3)
    alone = [torch.cat(decode_streamed(small, codes[i:i + 1]), -1)[0] for i in range(2)]
    with DecoderClient(small) as client:
        streams = [client.open_stream() for _ in range(2)]
        with client._cv:  # the worker waits until every frame is in: each chunk can batch
            for f in range(codes.shape[2]):
                for i in range(2):
                    streams[i].push(codes[i, :, f:f + 1])
            for s in streams:
                s.finish()
        got = [list(s) for s in streams]
    assert [c.shape[0] for c in got[0]] == [n * 24 for n in (1, 2, 4, 8, 16, 14)]
    for i in range(2):
        assert boundary_error(got[i], alone[i]).max_rel < 1e-6
    assert client.chunks == 12 and client.calls == 6


def test_client_threads(small, codes_for):
    """Talkers on their own threads, pushing frame by frame while the worker decodes."""
    codes = codes_for(small, 3, 40, seed=5)
    offline = small.decode(codes)
    with DecoderClient(small) as client:
        streams = [client.open_stream() for _ in range(3)]
        got: list = [None] * 3

        def talk(i):
            for f in range(codes.shape[2]):
                streams[i].push(codes[i, :, f:f + 1])
            streams[i].finish()

        def listen(i):
            got[i] = list(streams[i])

        threads = [threading.Thread(target=fn, args=(i,)) for i in range(3) for fn in (talk, listen)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    for i in range(3):
        assert boundary_error(got[i], offline[i]).max_rel < BOUND


def test_client_async_reader_and_uneven_streams(small, codes_for):
    """asyncio: frames pushed from the loop, chunks awaited; streams at different points of
    their ramps still each get their own audio."""
    codes = codes_for(small, 3, 30, seed=4)
    offline = small.decode(codes)

    async def run(client):
        async def one(i):
            stream = client.open_stream()
            for _ in range(i * 3):  # later streams start later
                await asyncio.sleep(0.005)
            for f in range(codes.shape[2]):
                stream.push(codes[i, :, f:f + 1])
                await asyncio.sleep(0)
            stream.finish()
            return [c async for c in stream]
        return await asyncio.gather(*(one(i) for i in range(3)))

    with DecoderClient(small, max_batch=2) as client:
        got = asyncio.run(run(client))
    for i in range(3):
        assert boundary_error(got[i], offline[i]).max_rel < BOUND


def test_client_error_reaches_reader(small, codes_for, monkeypatch):
    """A failed decode ends its own streams with the error; the client goes on."""
    with DecoderClient(small) as client:
        real = client._decoder.decode
        failed = []

        def first_call_fails(states, codes):
            if not failed:
                failed.append(True)
                raise RuntimeError("boom")
            return real(states, codes)

        monkeypatch.setattr(client._decoder, "decode", first_call_fails)
        stream = client.open_stream()
        stream.push(codes_for(small, 1, 1)[0])
        with pytest.raises(RuntimeError, match="boom"):
            list(stream)
        assert stream.get(timeout=5) is None
        ok = client.open_stream()
        ok.push(codes_for(small, 1, 3)[0])
        ok.finish()
        assert sum(c.shape[0] for c in ok) == 3 * 24


def test_finish_after_last_chunk_ends_stream(small, codes_for):
    """A stream whose frames filled its chunks exactly, finished afterwards (or never fed)."""
    with DecoderClient(small) as client:
        stream = client.open_stream()
        stream.push(codes_for(small, 1, 3)[0])  # chunks of 1 and 2 frames
        assert [stream.get(timeout=30).shape[0] for _ in range(2)] == [24, 48]
        stream.finish()
        assert stream.get(timeout=30) is None
        empty = client.open_stream()
        empty.finish()
        assert list(empty) == []


def test_push_checks_codes(small, codes_for):
    """Wrong frames fail the caller's push, not the stream later."""
    with DecoderClient(small) as client:
        stream = client.open_stream()
        with pytest.raises(ValueError):
            stream.push(codes_for(small, 1, 2)[0, :4])
        with pytest.raises(ValueError):
            stream.push(codes_for(small, 1, 2)[0] + 64)
        stream.push(codes_for(small, 1, 1)[0])
        stream.finish()
        assert [c.shape[0] for c in stream] == [24]


# --- measuring and writing -----------------------------------------------------------------------

def test_boundary_error_measures():
    x = torch.sin(torch.linspace(0, 100, 4800)) * 0.5
    assert boundary_error([x[:1000], x[1000:]], x) == (0.0, float("inf"))
    y = x.clone()
    y[1000] += 0.05
    err = boundary_error(y, x)
    assert err.max_rel == pytest.approx(0.1, rel=1e-3) and 30 < err.snr_db < 60


def test_pcm16():
    pcm = to_pcm16(torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5]))
    assert list(memoryview(pcm).cast("h")) == [0, 32767, -32767, 32767, 16384]


def test_wav_file_round_trips(tmp_path):
    chunks = [torch.linspace(-0.9, 0.9, n) for n in (1920, 3840, 100)]
    with open(tmp_path / "a.wav", "wb") as f, WavStreamWriter(f, 24000) as w:
        for c in chunks:
            w.write(c)
    with wave.open(str(tmp_path / "a.wav")) as r:
        assert (r.getnchannels(), r.getsampwidth(), r.getframerate(), r.getnframes()) == (1, 2, 24000, 5860)
        assert r.readframes(r.getnframes()) == b"".join(map(to_pcm16, chunks))


class _Pipe(io.BytesIO):
    def seekable(self):
        return False


def test_wav_stream_unknown_length():
    """To a pipe: sizes 0xFFFFFFFF, read back by wave as "until the end"."""
    chunks = [torch.linspace(-0.5, 0.5, n) for n in (1920, 960)]
    pipe = _Pipe()
    w = WavStreamWriter(pipe, 24000)
    for c in chunks:
        w.write(c)
    w.close()
    data = pipe.getvalue()
    assert int.from_bytes(data[4:8], "little") == UNKNOWN_SIZE == int.from_bytes(data[40:44], "little")
    with wave.open(io.BytesIO(data)) as r:
        assert r.getframerate() == 24000
        assert r.readframes(10**6) == b"".join(map(to_pcm16, chunks))
