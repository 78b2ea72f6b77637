"""OpenAI's ``POST /v1/audio/speech`` on a speech model's server: text in, audio streamed out
as the talker writes its frames (docs/guide/speech.md).

vLLM 0.32 has no such route, so the gate (:mod:`.gate`) answers it, after the key, the body
limits and the JSON checks every route gets. The talker runs in vLLM's own engine: the route
takes the engine client vLLM keeps on its app and streams one request through it, greedy, with
the top ``Q`` log-probabilities of each step, which carry the frame's ``Q`` codes
(:mod:`vllm_edge.models.speech.talker`). Each step's frame goes to the codec's decoder client
(:mod:`vllm_edge.models.speech.stream`), which decodes chunks on the ramp and batches the
chunks of concurrent requests; each decoded chunk is written to the response as it comes.

:func:`synthesize` is the whole path from text to audio chunks, shared with ``bench speech``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from vllm_edge.common.errors import EdgeError

SPEECH_PATH = "/v1/audio/speech"
logger = logging.getLogger("vllm_edge.serving")
# OpenAI's own cap on `input`.
MAX_INPUT_CHARS = 4096
# What we stream: 16-bit PCM, in a WAV container or bare. OpenAI's other formats (mp3, opus,
# aac, flac) need an encoder we do not ship; they are refused by name.
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}
ENCODED_FORMATS = ("mp3", "opus", "aac", "flac")
DEFAULT_FORMAT = "wav"


class SpeechError(EdgeError):
    """A request the route refuses, with its HTTP status and the field at fault."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: str
    response_format: str = DEFAULT_FORMAT


def parse_request(body: Any, voices: list[str], served: list[str] | None = None) -> SpeechRequest:
    """The request's fields, or a :class:`SpeechError` naming the one at fault."""
    if not isinstance(body, dict):
        raise SpeechError("the body must be a JSON object with 'input' and 'voice'")
    model = body.get("model")
    if model is not None and served and model not in served:
        raise SpeechError(f"The model `{model}` does not exist.", status=404, param="model")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise SpeechError("'input' must be a non-empty string: the text to speak", param="input")
    if len(text) > MAX_INPUT_CHARS:
        raise SpeechError(f"'input' is {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
                          param="input")
    voice = body.get("voice", voices[0] if voices else None)
    if isinstance(voice, dict):  # OpenAI's custom-voice form: {"id": ...}
        voice = voice.get("id")
    if voice not in voices:
        raise SpeechError(f"unknown voice {voice!r}; this model's voices: {', '.join(voices)}",
                          param="voice")
    fmt = body.get("response_format", DEFAULT_FORMAT)
    if fmt in ENCODED_FORMATS:
        raise SpeechError(f"response_format {fmt!r} needs an audio encoder this server does not "
                          f"have; use one of: {', '.join(FORMATS)}", param="response_format")
    if fmt not in FORMATS:
        raise SpeechError(f"unknown response_format {fmt!r}; use one of: {', '.join(FORMATS)}",
                          param="response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed != 1.0:
        raise SpeechError(f"speed {speed!r}: this talker speaks at 1.0 only", param="speed")
    if body.get("stream_format", "audio") != "audio":
        raise SpeechError(f"stream_format {body.get('stream_format')!r}: only 'audio' (the bytes "
                          "themselves, streamed) is served", param="stream_format")
    return SpeechRequest(text, voice, fmt)


@dataclass
class Timings:
    """Where one request's time went (``bench speech`` reads it)."""
    start: float = field(default_factory=time.perf_counter)
    first_frame_s: float | None = None  # the talker's first frame, from the request
    first_audio_s: float | None = None  # the codec's first chunk, from the request
    frames: int = 0
    samples: int = 0
    codec_s: float = 0.0  # the decoder thread's time on this request's chunks (approximate)


class SpeechModel:
    """A talker checkpoint as the route uses it: its speech facts, its tokenizer, its codec."""

    def __init__(self, model_dir: Path, spec: Any, tokenizer: Any) -> None:
        self.model_dir, self.spec, self.tokenizer = model_dir, spec, tokenizer

    @classmethod
    def load(cls, model_dir: str | Path) -> SpeechModel:
        from transformers import AutoTokenizer

        from vllm_edge.models.speech import talker

        model_dir = Path(model_dir)
        spec = talker.spec_of(model_dir)  # a model that does not speak is refused here, by name
        return cls(model_dir, spec, AutoTokenizer.from_pretrained(str(model_dir)))

    @property
    def voices(self) -> list[str]:
        return list(self.spec.voices)

    def prompt_ids(self, text: str, voice: str) -> list[int]:
        from vllm_edge.models.speech import talker

        return talker.prompt(text, voice, self.tokenizer, self.spec)["prompt_token_ids"]

    def frames_for(self, text: str, prompt_len: int, max_model_len: int | None) -> int:
        """The utterance's frame bound, or a 400 when the server's context cannot hold it."""
        from vllm_edge.models.speech import talker

        need = talker.max_frames(text, self.spec)
        room = (max_model_len - prompt_len) if max_model_len else need
        if need > room:
            raise SpeechError(f"'input' needs up to {need} frames and this server's context holds "
                              f"{max(room, 0)} after the prompt (--max-model-len {max_model_len}); "
                              "send shorter text", param="input")
        return need

    def sampling_params(self, frames_max: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        from vllm_edge.models.speech import talker

        return talker.sampling_params(self.spec, frames_max, output_kind=RequestOutputKind.DELTA)

    def frames(self, delta_output: Any) -> Any:
        """The frames ``[Q, f]`` of one streamed delta, and whether the utterance ended."""
        from vllm_edge.models.speech import talker

        got = talker.frames(delta_output, self.spec)
        return got.codes, got.ended

    def decoder_client(self) -> Any:
        from vllm_edge.models.speech import codec, stream

        return stream.DecoderClient(codec.load_codec(n_q=self.spec.n_q))

    def describe(self) -> dict[str, Any]:
        return {"codec": self.spec.codec, "frame_rate": self.spec.frame_rate, "n_q": self.spec.n_q,
                "codebook_size": self.spec.codebook_size, "voices": self.voices,
                "synthetic_weights": self.spec.synthetic_weights}


def _max_model_len(engine: Any) -> int | None:
    cfg = getattr(engine, "model_config", None)
    return getattr(cfg, "max_model_len", None)


async def synthesize(engine: Any, speech: SpeechModel, decoder: Any, req: SpeechRequest, *,
                     schedule: Any = None, timings: Timings | None = None,
                     request_id: str | None = None) -> AsyncIterator[Any]:
    """Text to float audio chunks: the talker's frames through ``engine`` (vLLM's engine
    client), decoded by ``decoder`` (a :class:`DecoderClient`) on ``schedule``'s ramp. The
    engine request is aborted if the caller stops iterating (a client that left)."""
    timings = timings or Timings()
    prompt = speech.prompt_ids(req.text, req.voice)
    params = speech.sampling_params(speech.frames_for(req.text, len(prompt), _max_model_len(engine)))
    request_id = request_id or f"speech-{uuid.uuid4().hex}"
    stream = decoder.open_stream(schedule)

    async def pump() -> None:
        try:
            async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id):
                codes, ended = speech.frames(out.outputs[0])
                if codes.shape[1]:
                    if timings.first_frame_s is None:
                        timings.first_frame_s = time.perf_counter() - timings.start
                    timings.frames += int(codes.shape[1])
                    stream.push(codes)
                if ended:
                    break
            stream.finish()
        except BaseException:
            stream.cancel()
            raise

    task = asyncio.create_task(pump())
    try:
        async for chunk in stream:
            if timings.first_audio_s is None:
                timings.first_audio_s = time.perf_counter() - timings.start
            timings.samples += int(chunk.numel())
            yield chunk
        await task  # the talker's own error, if it failed
    finally:
        if not task.done():
            task.cancel()
            await engine.abort(request_id)
            stream.cancel()


class SpeechRoute:
    """The route on one server: the model's speech facts and one decoder client, made on the
    first request (the codec is loaded once per server)."""

    def __init__(self, model_dir: str | Path, served: list[str] | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.speech = SpeechModel.load(self.model_dir)
        self.served = served
        self._decoder = None
        self._lock = asyncio.Lock()

    @staticmethod
    def speaks(model_dir: str | Path | None) -> bool:
        from vllm_edge.models.speech import talker

        if model_dir is None:
            return False
        try:
            talker.spec_of(model_dir)
        except talker.TalkerError:
            return False
        return True

    async def decoder(self) -> Any:
        async with self._lock:
            if self._decoder is None:
                self._decoder = await asyncio.to_thread(self.speech.decoder_client)
            return self._decoder

    async def __call__(self, scope: dict, body: bytes, send: Callable[[dict], Awaitable[None]],
                       receive: Callable[[], Awaitable[dict]]) -> None:
        try:
            req = parse_request(json.loads(body or b"null"), self.speech.voices, self.served)
        except ValueError as exc:  # json
            raise SpeechError(f"the body is not JSON: {exc}") from None
        engine = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
        if engine is None:
            raise SpeechError("this server has no engine to speak with", status=503)
        decoder = await self.decoder()
        rate = decoder.codec.facts.sample_rate
        from vllm_edge.models.speech.stream import to_pcm16, wav_header

        chunks = synthesize(engine, self.speech, decoder, req)
        left = asyncio.Event()

        async def watch() -> None:  # a client that hangs up stops the talker and the codec
            while (await receive())["type"] != "http.disconnect":
                pass
            left.set()

        watcher = asyncio.create_task(watch())
        started = False
        try:
            async for chunk in chunks:
                if left.is_set():
                    break
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-type", FORMATS[req.response_format].encode()),
                        (b"x-sample-rate", str(rate).encode())]})
                    if req.response_format == "wav":
                        await send({"type": "http.response.body", "body": wav_header(rate),
                                    "more_body": True})
                await send({"type": "http.response.body", "body": to_pcm16(chunk), "more_body": True})
            if not started:  # no frame at all: still a valid, empty stream
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", FORMATS[req.response_format].encode()),
                    (b"x-sample-rate", str(rate).encode())]})
                if req.response_format == "wav":
                    await send({"type": "http.response.body", "body": wav_header(rate, 0), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:
            if not started:
                raise  # the gate answers it with its status
            # the audio has begun: all that is left is to end it where it stopped
            logger.exception("speech request failed after its audio began")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            await chunks.aclose()
