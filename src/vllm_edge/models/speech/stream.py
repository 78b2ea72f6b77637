"""Streaming the codec: frames in as the talker makes them, audio out chunk by chunk.

Two routes:

- **Stateful** (``StatefulDecoder``, what ``DecoderClient`` runs): each stream carries the
  state that offline decoding would have at the chunk boundary (the causal convolutions'
  last inputs, the transposed convolutions' overlapping tail, the decoder transformer's keys
  and values of the last ``sliding_window - 1`` steps), so streamed audio equals one offline
  decode of all frames (to float rounding, ~1e-6 of the peak) at any chunk size, with no
  frame decoded twice. transformers' ``MimiModel.decode`` takes the transformer's cache
  (``decoder_past_key_values``) but its SEANet decoder and upsample keep no state, so decode()
  chunk by chunk with that cache alone clicks at every boundary; the conv states are kept
  here, around the model's own modules and weights.
- **Stateless with left context** (``decode_with_left_context``): re-decode the last
  ``left_context`` frames before each chunk and drop their audio. It is exact only with the
  whole receptive field as context (``CodecFacts.receptive_field_frames``: ~1000 frames,
  because the transformer's windows stack over its 8 layers), so it trades error for compute
  (at Mimi's shapes, a context shorter than the 5-frame conv history clicks at every boundary,
  and the error then falls slowly with the context until one 250-step window, 125 frames, is
  covered); it stays for that measurement and for codecs with no state to carry.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import struct
import threading
import wave
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

import torch
from torch import nn
from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

from vllm_edge.models.speech.codec import Codec

logger = logging.getLogger("vllm_edge.models.speech")


@dataclass(frozen=True)
class RampSchedule:
    """Chunk sizes in frames: small first so audio starts early, then growing to a steady size
    that amortises the per-call cost.

    Sizes go ``first_frames``, then ``ceil(prev * growth) + step`` capped at ``steady_frames``;
    the defaults give 1, 2, 4, 8, 16, 25, 25, ... Measured at Mimi's shapes on 2 cores
    (stateful): a call costs a fixed part (reading the decoder transformer's weights) that a
    one-frame chunk is mostly made of, so one frame decodes in about the time of two and the
    first 80 ms of audio waits only for the talker's first frame; each chunk of the doubling
    decodes in well under the audio already delivered, so playback never stalls on the codec;
    the cost per frame stops falling at 16-25 frames and 50 is no cheaper, so the steady size
    is 25 frames (2 s of audio, decoded at well under a tenth of real time).

    ``left_context`` is read only by the stateless route (the stateful one needs none): 125
    frames, one 250-step window, is where its boundary error fell under 1e-4 of the peak for
    the synthetic codec; with a transformer that weighs more (layer scale 1 instead of Mimi's
    0.01 init) it took 250. Measure again with a real checkpoint before relying on it.
    """

    first_frames: int = 1
    growth: float = 2.0
    step: int = 0
    steady_frames: int = 25
    left_context: int = 125

    def __post_init__(self):
        if not 1 <= self.first_frames <= self.steady_frames:
            raise ValueError("need 1 <= first_frames <= steady_frames")
        if self.growth < 1 or self.step < 0 or self.left_context < 0:
            raise ValueError("growth must be >= 1, step and left_context >= 0")
        if self.first_frames < self.steady_frames and self.growth == 1 and self.step == 0:
            raise ValueError("a ramp that never grows: set growth > 1 or step > 0")

    def sizes(self) -> Iterator[int]:
        """The chunk sizes, forever (the last chunk of a stream is whatever frames remain)."""
        n = self.first_frames
        while True:
            yield n
            n = min(self.steady_frames, max(n + 1, math.ceil(n * self.growth) + self.step))

    def chunks(self, total_frames: int) -> list[tuple[int, int]]:
        """``(start, end)`` frame ranges covering ``total_frames``, in order."""
        out, start = [], 0
        for n in self.sizes():
            if start >= total_frames:
                return out
            out.append((start, min(total_frames, start + n)))
            start += n
        raise AssertionError("unreachable")


NO_RAMP = RampSchedule(first_frames=25, steady_frames=25)


# --- the stateful route --------------------------------------------------------------------------

class StreamState:
    """One stream's decoder state between chunks. Owned by one ``StatefulDecoder`` call at a
    time: nothing in it is locked."""

    def __init__(self):
        self.frames = 0  # frames decoded so far: the transformer's positions continue from here
        self.conv: dict[int, torch.Tensor] = {}  # causal conv -> its last inputs [1, C, pad]
        self.tail: dict[int, torch.Tensor] = {}  # transposed conv -> its overlapping outputs [1, C, k - s]
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, [1, H, n, D]


class _BatchCache:
    """What ``MimiAttention`` calls ``update`` on: prepends each layer's past keys and values
    (left-padded to one length across the batch) and remembers the full result."""

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]] | None):
        self.past = past
        self.full: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key, value, layer_idx, *args, **kwargs):
        if self.past is not None:
            pk, pv = self.past[layer_idx]
            key, value = torch.cat([pk, key], dim=2), torch.cat([pv, value], dim=2)
        self.full[layer_idx] = (key, value)
        return key, value


class StatefulDecoder:
    """Exact chunked decoding of many streams at once, around a ``Codec``'s own modules.

    ``decode(states, codes)`` decodes the next ``F`` frames of ``B`` streams in one call; each
    state advances by ``F`` frames. Streams in one call need the same ``F`` (the causal convs'
    states would be corrupted by padded frames); their transformer histories may differ in
    length (left-padded and masked). Not thread-safe: one caller at a time.
    """

    def __init__(self, codec: Codec):
        self.codec = codec
        m = codec.model
        cfg = m.config
        self.window = int(cfg.sliding_window)
        self.layers = m.decoder_transformer.layers
        self.rotary = m.decoder_transformer.rotary_emb
        self.keep = self.window - 1  # keys a query can still see after this chunk
        convs = [mod for mod in m.modules() if isinstance(mod, (MimiConv1d, MimiConvTranspose1d))]
        self._index = {id(mod): i for i, mod in enumerate(convs)}
        for mod in m.decoder.modules():
            if isinstance(mod, MimiConv1d) and int(mod.stride) != 1:
                raise ValueError("a strided conv in the SEANet decoder: not a Mimi decoder")
            if isinstance(mod, MimiConvTranspose1d) and mod.padding_left != 0:
                raise ValueError("trim_right_ratio != 1: the streaming tail assumes all trimming is on the "
                                 "right")

    def new_state(self) -> StreamState:
        return StreamState()

    def decode(self, states: Sequence[StreamState], codes: torch.Tensor) -> torch.Tensor:
        """``codes`` ``[B, Q, F]`` for ``states`` (one each) -> float32 audio
        ``[B, F * samples_per_frame]``."""
        codes = self.codec.check_codes(codes)
        if codes.shape[0] != len(states):
            raise ValueError(f"{codes.shape[0]} code rows for {len(states)} states")
        if codes.shape[2] == 0:
            return torch.zeros(len(states), 0)  # an empty chunk moves no state
        m = self.codec.model
        with torch.inference_mode():
            x = m.quantizer.decode(codes)
            x = self._convtr(m.upsample, x, states)
            x = self._transformer(x.transpose(1, 2), states).transpose(1, 2)
            for layer in m.decoder.layers:
                x = self._run(layer, x, states)
        for s in states:
            s.frames += codes.shape[2]
        return x[:, 0].float()

    def _run(self, layer: nn.Module, x: torch.Tensor, states) -> torch.Tensor:
        if isinstance(layer, MimiConv1d):
            return self._conv(layer, x, states)
        if isinstance(layer, MimiConvTranspose1d):
            return self._convtr(layer, x, states)
        if isinstance(layer, MimiResnetBlock):
            h = x
            for sub in layer.block:
                h = self._run(sub, h, states)
            return self._run(layer.shortcut, x, states) + h
        return layer(x)

    def _conv(self, layer: MimiConv1d, x: torch.Tensor, states) -> torch.Tensor:
        pad = int(layer.padding_total)
        if pad == 0:
            return layer.conv(x)
        key = self._index[id(layer)]
        prev = []
        for i, s in enumerate(states):
            p = s.conv.get(key)
            if p is None:  # offline pads the start: zeros, or the first input repeated
                if layer.pad_mode == "replicate":
                    p = x[i:i + 1, :, :1].expand(-1, -1, pad)
                elif layer.pad_mode == "constant":
                    p = x.new_zeros(1, x.shape[1], pad)
                else:
                    raise NotImplementedError(f"pad_mode {layer.pad_mode!r} cannot stream")
            prev.append(p)
        x = torch.cat([torch.cat(prev), x], dim=2)
        for i, s in enumerate(states):
            s.conv[key] = x[i:i + 1, :, -pad:]
        return layer.conv(x)

    def _convtr(self, layer: MimiConvTranspose1d, x: torch.Tensor, states) -> torch.Tensor:
        y = _conv_transpose(layer.conv, x)
        pt = int(layer.padding_right)
        if pt == 0:
            return y
        key = self._index[id(layer)]
        tails = [s.tail.get(key) for s in states]
        if any(t is not None for t in tails):
            y[:, :, :pt] += torch.cat([t if t is not None else y.new_zeros(1, y.shape[1], pt) for t in tails])
        tail = y[:, :, -pt:]
        if layer.conv.bias is not None:  # the next chunk's head adds the bias again
            tail = tail - layer.conv.bias[None, :, None]
        for i, s in enumerate(states):
            s.tail[key] = tail[i:i + 1]
        return y[:, :, :-pt]

    def _transformer(self, h: torch.Tensor, states) -> torch.Tensor:
        batch, steps = h.shape[0], h.shape[1]
        spf = self.codec.facts.transformer_steps_per_frame
        lengths = [0 if s.kv is None else s.kv[0][0].shape[2] for s in states]
        n = max(lengths)
        past = None
        if n:
            past = []
            for li in range(len(self.layers)):
                ks, vs = [], []
                for s, length in zip(states, lengths):
                    k, v = s.kv[li] if s.kv is not None else (None, None)
                    if length < n:
                        like = self._kv_like(states, li)
                        padk = like.new_zeros(1, like.shape[1], n - length, like.shape[3])
                        k = padk if k is None else torch.cat([padk, k], dim=2)
                        v = padk if v is None else torch.cat([padk, v], dim=2)
                    ks.append(k)
                    vs.append(v)
                past.append((torch.cat(ks), torch.cat(vs)))
        # key j (past ones first, right-aligned) is visible to query t when 0 <= (n + t) - j < window
        dev = h.device
        q = torch.arange(steps, device=dev)[:, None] + n
        kv = torch.arange(n + steps, device=dev)[None, :]
        visible = (q - kv >= 0) & (q - kv < self.window)
        valid = torch.stack([kv[0] >= n - length for length in lengths])  # [B, n + steps]
        allowed = visible[None] & valid[:, None, :]
        mask = torch.zeros(batch, 1, steps, n + steps, dtype=h.dtype, device=dev)
        mask.masked_fill_(~allowed[:, None], torch.finfo(h.dtype).min)
        positions = torch.stack([torch.arange(steps, device=dev) + s.frames * spf for s in states])
        cos_sin = self.rotary(h, positions)
        cache = _BatchCache(past)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, past_key_values=cache, position_embeddings=cos_sin)[0]
        for i, (s, length) in enumerate(zip(states, lengths)):
            keep = min(length + steps, self.keep)
            s.kv = [(k[i:i + 1, :, -keep:], v[i:i + 1, :, -keep:]) for k, v in
                    (cache.full[li] for li in range(len(self.layers)))]
        return h

    @staticmethod
    def _kv_like(states, li) -> torch.Tensor:
        for s in states:
            if s.kv is not None:
                return s.kv[li][0]
        raise AssertionError("padding asked for with no history in the batch")


# torch's CPU transposed conv costs about as much for one frame as for 50 on Mimi's first SEANet
# layer (1024 -> 512, kernel 16: 8.4M weights), half of a one-frame decode; one GEMM against
# the weight as stored, then overlap-add, costs a tenth of it there. On the smaller layers
# torch's own is as fast or faster, so it stays there.
GEMM_CONVTR_MIN_WEIGHTS = 1 << 22


def _conv_transpose(conv: nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` (untrimmed), through a GEMM for the large ungrouped layers."""
    if conv.groups != 1 or conv.weight.numel() < GEMM_CONVTR_MIN_WEIGHTS or conv.padding != (0,) \
            or conv.dilation != (1,) or conv.output_padding != (0,):
        return conv(x)
    batch, cin, steps = x.shape
    k, s, cout = conv.kernel_size[0], conv.stride[0], conv.out_channels
    cols = (x.transpose(1, 2) @ conv.weight.view(cin, cout * k)).view(batch, steps, cout, k)
    n = math.ceil(k / s)
    if n * s != k:
        cols = nn.functional.pad(cols, (0, n * s - k))
    y = x.new_zeros(batch, cout, (steps + n - 1) * s)
    for j in range(n):  # kernel tap j*s..(j+1)*s of input t lands at output (t + j)*s..
        y[:, :, j * s:(j + steps) * s] += cols[..., j * s:(j + 1) * s].permute(0, 2, 1, 3).reshape(
            batch, cout, steps * s)
    y = y[:, :, :(steps - 1) * s + k]
    if conv.bias is not None:
        y += conv.bias[:, None]
    return y


def decode_streamed(codec: Codec, codes: torch.Tensor,
                    schedule: RampSchedule = RampSchedule()) -> list[torch.Tensor]:
    """The stateful route over a whole ``[B, Q, F]`` code sequence, chunked by ``schedule``:
    the chunks' audio, in order (what a listener would receive)."""
    dec = StatefulDecoder(codec)
    states = [dec.new_state() for _ in range(codes.shape[0])]
    return [dec.decode(states, codes[:, :, a:b]) for a, b in schedule.chunks(codes.shape[2])]


def decode_with_left_context(codec: Codec, codes: torch.Tensor, schedule: RampSchedule = RampSchedule(),
                             left_context: int | None = None) -> list[torch.Tensor]:
    """The stateless route: each chunk decoded alone after up to ``left_context`` earlier
    frames (default ``schedule.left_context``), whose audio is dropped. Costs the context's
    decode at every chunk and is exact only past the receptive field."""
    ctx = schedule.left_context if left_context is None else left_context
    spf = codec.facts.samples_per_frame
    out = []
    for a, b in schedule.chunks(codes.shape[2]):
        c = max(0, a - ctx)
        out.append(codec.decode(codes[:, :, c:b])[:, (a - c) * spf:])
    return out


# --- many streams, one decoder -------------------------------------------------------------------

_END = object()


class CodecStream:
    """One utterance's frames in, its PCM chunks out, in order.

    ``push`` and ``finish`` never block and may be called from any thread or an event loop;
    read with ``for chunk in stream`` (blocking) or ``async for chunk in stream``. Each chunk
    is a float32 tensor of ``frames * samples_per_frame`` samples at the codec's rate; a decode
    error is raised to the reader.
    """

    def __init__(self, client: DecoderClient, schedule: RampSchedule):
        self._client = client
        self._sizes = schedule.sizes()
        self.next_size = next(self._sizes)
        self.pending: list[torch.Tensor] = []  # [Q, f] pieces
        self.pending_frames = 0
        self.finished = False
        self.state = client._decoder.new_state()
        self.ready_at: int | None = None  # when its next chunk became ready: the decode order
        self.in_flight = False  # a chunk of it is being decoded
        self._out: collections.deque = collections.deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def push(self, codes: torch.Tensor) -> None:
        """Frames ``[Q, F]`` or ``[1, Q, F]`` (F may be 1), appended to what is pending."""
        if codes.dim() == 3 and codes.shape[0] == 1:
            codes = codes[0]
        if codes.dim() != 2 or codes.shape[0] != self._client.codec.facts.n_q:
            raise ValueError(f"push [Q, F] or [1, Q, F] frames with Q={self._client.codec.facts.n_q}, "
                             f"got {list(codes.shape)}")
        self._client.codec.check_codes(codes[None])  # bad codes fail the talker, not the stream
        with self._client._cv:
            if self.finished:
                raise RuntimeError("push after finish")
            self.pending.append(codes.detach().to("cpu", torch.int64))
            self.pending_frames += codes.shape[1]
            self._requeue()
            self._client._cv.notify()

    def finish(self) -> None:
        """No more frames: what is pending is decoded as a last, possibly shorter, chunk."""
        with self._client._cv:
            self.finished = True
            self._requeue()
            ended = not self.pending_frames and not self.in_flight
            if ended:
                self._client._streams.discard(self)
            self._client._cv.notify()
        if ended:
            self._deliver(_END)

    def cancel(self) -> None:
        """Drop the stream: pending frames are not decoded and the reader sees the end."""
        with self._client._cv:
            self._client._streams.discard(self)
            self.finished = True
            self.ready_at = None
            self.pending, self.pending_frames = [], 0
        self._deliver(_END)

    def _requeue(self, again: bool = False) -> None:
        """Under the client's lock: a chunk that just became ready queues behind those already
        waiting (``again``: after a take, the next chunk goes to the back)."""
        if again or not self._ready_frames():
            self.ready_at = None
        if self.ready_at is None and self._ready_frames():
            self._client._tick += 1
            self.ready_at = self._client._tick

    def _ready_frames(self) -> int:
        """Frames the next chunk would take now (0: not ready). Called under the client's lock."""
        if self.pending_frames >= self.next_size:
            return self.next_size
        return self.pending_frames if self.finished else 0

    def _take(self, n: int) -> torch.Tensor:
        """Pop the next ``n`` pending frames as ``[Q, n]``. Called under the client's lock."""
        codes = torch.cat(self.pending, dim=1)
        self.pending = [codes[:, n:]] if codes.shape[1] > n else []
        self.pending_frames -= n
        if n == self.next_size:
            self.next_size = next(self._sizes)
        self._requeue(again=True)
        return codes[:, :n]

    def _deliver(self, item) -> None:
        with self._client._cv:
            self._out.append(item)
            waiters, self._waiters = self._waiters, []
            self._client._cv.notify_all()
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def get(self, timeout: float | None = None) -> torch.Tensor | None:
        """The next chunk, blocking; ``None`` at the end of the stream."""
        with self._client._cv:
            if not self._client._cv.wait_for(lambda: self._out, timeout):
                raise TimeoutError("no audio chunk in time")
            item = self._out.popleft()
            if item is _END:
                self._out.appendleft(item)  # the end stays the end for any later read
        return self._unwrap(item)

    async def aget(self) -> torch.Tensor | None:
        """The next chunk without blocking the event loop; ``None`` at the end."""
        loop = asyncio.get_running_loop()
        while True:
            with self._client._cv:
                if self._out:
                    item = self._out.popleft()
                    if item is _END:
                        self._out.appendleft(item)
                    return self._unwrap(item)
                event = asyncio.Event()
                self._waiters.append((loop, event))
            await event.wait()

    @staticmethod
    def _unwrap(item):
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def __iter__(self) -> Iterator[torch.Tensor]:
        while (chunk := self.get()) is not None:
            yield chunk

    async def __aiter__(self) -> AsyncIterator[torch.Tensor]:
        while (chunk := await self.aget()) is not None:
            yield chunk


class DecoderClient:
    """The codec for a server: one worker thread owns the model and every stream's state, and
    decodes the chunks that are ready, several streams' chunks of one size in one batched call.

    Thread-safe and asyncio-friendly: ``open_stream``, ``CodecStream.push`` and ``finish``
    only take a lock, the decoding happens on the worker thread (torch releases the GIL there,
    so an event loop keeps running), and ``async for`` readers are woken through their loop.
    Streams whose next chunks differ in size (one early in its ramp, one at steady size) are
    decoded in separate calls, oldest first; while one call runs, the others' frames pile up and
    go together into the next.

    A call takes at most ``max_batch`` chunks and ``max_batch_frames`` frames in all (but
    always one chunk). Batching pays while chunks are small, when a call's cost is mostly
    reading the weights (four one-frame chunks in one call cost under half of four calls); at
    25 frames the work is compute and a batch only delays its first stream's audio.
    """

    def __init__(self, codec: Codec, schedule: RampSchedule = RampSchedule(), *, max_batch: int = 8,
                 max_batch_frames: int = 32):
        self.codec = codec
        self.schedule = schedule
        self.max_batch = max_batch
        self.max_batch_frames = max_batch_frames
        self._decoder = StatefulDecoder(codec)
        self._cv = threading.Condition()
        self._streams: set[CodecStream] = set()
        self._tick = 0
        self._closed = False
        self.calls = 0  # decode calls made, and the chunks they carried: how much batching happened
        self.chunks = 0
        self._thread = threading.Thread(target=self._loop, name="codec-decoder", daemon=True)
        self._thread.start()

    def open_stream(self, schedule: RampSchedule | None = None) -> CodecStream:
        """A new stream (its own ramp if ``schedule`` is given)."""
        stream = CodecStream(self, schedule or self.schedule)
        with self._cv:
            if self._closed:
                raise RuntimeError("decoder client closed")
            self._streams.add(stream)
        return stream

    def close(self) -> None:
        """Stop the worker after the call in flight; open streams end."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        for s in list(self._streams):
            s._deliver(_END)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _next_batch(self) -> tuple[list[CodecStream], torch.Tensor] | None:
        """Under the lock: the size of the chunk that has waited longest, and chunks of that
        size, oldest first, as many as the limits allow, their frames popped."""
        ready = sorted((s for s in self._streams if s.ready_at is not None), key=lambda s: s.ready_at)
        if not ready:
            return None
        size = ready[0]._ready_frames()
        limit = max(1, min(self.max_batch, self.max_batch_frames // size))
        group = [s for s in ready if s._ready_frames() == size][:limit]
        for s in group:
            s.in_flight = True
        return group, torch.stack([s._take(size) for s in group])

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or any(s.ready_at is not None for s in self._streams))
                if self._closed:
                    return
                group, codes = self._next_batch()
            try:
                audio = self._decoder.decode([s.state for s in group], codes)
            except Exception as e:  # the readers of these streams see it; others go on
                logger.exception("codec decode failed")
                with self._cv:
                    for s in group:
                        s.in_flight = False
                        self._streams.discard(s)
                for s in group:
                    s._deliver(e)
                    s._deliver(_END)
                continue
            self.calls += 1
            self.chunks += len(group)
            for i, s in enumerate(group):
                s._deliver(audio[i])
                with self._cv:
                    s.in_flight = False
                    done = s.finished and not s.pending_frames
                    if done:
                        self._streams.discard(s)
                if done:
                    s._deliver(_END)


# --- measuring and writing audio -----------------------------------------------------------------

class BoundaryError(NamedTuple):
    max_rel: float  # max |streamed - offline| / max |offline|
    snr_db: float  # offline energy over difference energy, in dB (inf when equal)


def boundary_error(streamed: torch.Tensor | Sequence[torch.Tensor], offline: torch.Tensor) -> BoundaryError:
    """How far chunked audio is from one offline decode of the same frames. Relative to the
    offline peak so the bound does not depend on the codec's output level."""
    if not isinstance(streamed, torch.Tensor):
        streamed = torch.cat(list(streamed), dim=-1)
    if streamed.shape != offline.shape:
        raise ValueError(f"streamed {list(streamed.shape)} vs offline {list(offline.shape)}")
    ref, diff = offline.double(), (streamed.double() - offline.double())
    peak = float(ref.abs().max())
    max_rel = float(diff.abs().max()) / peak if peak else float(diff.abs().max())
    noise = float(diff.pow(2).sum())
    snr = math.inf if noise == 0 else 10 * math.log10(float(ref.pow(2).sum()) / noise)
    return BoundaryError(max_rel, snr)


def to_pcm16(audio: torch.Tensor) -> bytes:
    """Float audio in [-1, 1] -> little-endian 16-bit PCM bytes (clipped, rounded)."""
    pcm = (audio.detach().float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    return pcm.cpu().numpy().astype("<i2").tobytes()


UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(sample_rate: int, data_bytes: int | None = None, channels: int = 1) -> bytes:
    """A 44-byte PCM16 WAV header. ``data_bytes=None``: length unknown (streaming), so the
    RIFF and data sizes are 0xFFFFFFFF, which players read as "until the end"."""
    block = 2 * channels
    riff = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    data = UNKNOWN_SIZE if data_bytes is None else data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
            + b"data" + struct.pack("<I", data))


class WavStreamWriter:
    """PCM16 mono WAV written chunk by chunk. To a seekable file it goes through the stdlib
    ``wave`` writer, which rewrites the sizes after every chunk (the file is valid even if the
    writer dies); to a pipe or socket, a header with unknown sizes first, then raw samples."""

    def __init__(self, fileobj: BinaryIO, sample_rate: int):
        self._file = fileobj
        self.frames = 0
        seekable = getattr(fileobj, "seekable", lambda: False)()
        if seekable:
            self._wave = wave.open(fileobj, "wb")  # noqa: SIM115 (closed by close())
            self._wave.setnchannels(1)
            self._wave.setsampwidth(2)
            self._wave.setframerate(sample_rate)
        else:
            self._wave = None
            fileobj.write(wav_header(sample_rate))

    def write(self, audio: torch.Tensor) -> None:
        """A float chunk (1-D, in [-1, 1])."""
        data = to_pcm16(audio.reshape(-1))
        self.frames += len(data) // 2
        if self._wave is not None:
            self._wave.writeframes(data)
        else:
            self._file.write(data)

    def close(self) -> None:
        """Finish the header (seekable files); the file object itself stays open."""
        if self._wave is not None:
            self._wave.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_wav(path, chunks: Iterable[torch.Tensor], sample_rate: int) -> int:
    """Chunks to a WAV file as they come; the samples written."""
    with open(path, "wb") as f, WavStreamWriter(f, sample_rate) as w:
        for chunk in chunks:
            w.write(chunk)
        return w.frames
