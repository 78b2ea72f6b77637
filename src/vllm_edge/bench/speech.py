"""`vllm-edge bench speech`: speech out, streamed, measured end to end on this machine.

One process holds what a speech server holds: vLLM's async engine with the talker, and the
codec's decoder client. Each request goes through :func:`vllm_edge.serving.speech.synthesize`,
the route's own path from text to audio chunks, so what is timed here is what the route does
(minus HTTP). Measured, in one run:

- **time to first audio** (request to the first decoded chunk) with the ramp and without it
  (:data:`~vllm_edge.models.speech.stream.NO_RAMP`: every chunk at the steady size), interleaved,
  order rotated each pass; medians;
- **real-time factor** (wall time / audio time) at batch 1, and per stream with 4 concurrent
  requests (each stream's own wall time over its own audio);
- **the talker's and the codec's shares**: the talker alone (its frames, nothing decoded) and the
  codec alone (the same frames, decoded on the same ramp), each timed;
- **peak RssAnon** over the process tree (this process and the engine core), sampled throughout;
- **the boundary error**: the streamed audio against one offline decode of all frames, for the
  stateful route (the default) and for the stateless route at each left context.

Writes ``benchmarks/results/speech/stream.json`` with provenance.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = "benchmarks/results/speech/stream.json"
DEFAULT_TEXT = ("The quick brown fox jumps over the lazy dog, then rests in the shade of an old "
                "oak tree while the river runs by.")
LEFT_CONTEXTS = (0, 1, 2, 4, 8, 16, 25, 50, 125, 250)  # up to past the transformer window
STREAMS = 4


class _PeakSampler:
    """Peak RssAnon over this process's tree, sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.1) -> None:
        self.every, self.peak_mb, self._stop = every, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def _run(self) -> None:
        import os

        from vllm_edge.common.procmem import tree_rss_anon_mb

        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, tree_rss_anon_mb(os.getpid())[0])
            self._stop.wait(self.every)

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


async def _one(engine, speech, decoder, req, schedule) -> dict:
    from vllm_edge.serving.speech import Timings, synthesize

    t = Timings()
    async for _ in synthesize(engine, speech, decoder, req, schedule=schedule, timings=t):
        pass
    wall = time.perf_counter() - t.start
    audio_s = t.samples / decoder.codec.facts.sample_rate
    return {"ttfa_s": t.first_audio_s, "first_frame_s": t.first_frame_s, "wall_s": wall,
            "frames": t.frames, "audio_s": audio_s, "rtf": wall / audio_s if audio_s else None}


async def _talker_alone(engine, speech, req) -> tuple[Any, float]:
    """The frames of ``req`` as ``[1, Q, F]``, and the talker's wall time for them."""
    import torch

    from vllm_edge.serving.speech import _max_model_len

    prompt = speech.prompt_ids(req.text, req.voice)
    params = speech.sampling_params(speech.frames_for(req.text, len(prompt), _max_model_len(engine)))
    pieces, t0 = [], time.perf_counter()
    async for out in engine.generate({"prompt_token_ids": prompt}, params, f"talker-alone-{time.monotonic_ns()}"):
        codes, ended = speech.frames(out.outputs[0])
        pieces.append(codes)
        if ended:
            break
    wall = time.perf_counter() - t0
    return torch.cat(pieces, dim=1).unsqueeze(0), wall


async def _measure(model_dir: Path, *, passes: int, text: str, voice: str | None, enforce_eager: bool,
                   log) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_edge.models.speech import stream as codec_stream
    from vllm_edge.runtime.engine import edge_engine
    from vllm_edge.serving.speech import SpeechModel, SpeechRequest

    speech = SpeechModel.load(model_dir)
    req = SpeechRequest(text, voice or speech.voices[0])
    eng = edge_engine(model_dir, server=True, max_num_seqs=STREAMS, enforce_eager=enforce_eager)
    eng.apply_env()
    with _PeakSampler() as peak:
        t0 = time.perf_counter()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**eng.kwargs))
        decoder = speech.decoder_client()
        ready_s = time.perf_counter() - t0
        ramp, no_ramp = decoder.schedule, codec_stream.NO_RAMP
        try:
            log(f"engine and codec ready in {ready_s:.1f} s; warming up")
            await _one(engine, speech, decoder, req, ramp)  # first-call costs: not measured
            arms: dict[str, list[dict]] = {"ramp": [], "no_ramp": []}
            for p in range(passes):
                order = list(arms) if p % 2 == 0 else list(reversed(arms))
                for name in order:
                    rec = await _one(engine, speech, decoder, req, ramp if name == "ramp" else no_ramp)
                    arms[name].append(rec)
                    log(f"pass {p + 1}/{passes} {name}: first audio {rec['ttfa_s']:.3f} s, "
                        f"RTF {rec['rtf']:.3f}")
            concurrent: list[list[dict]] = []
            for p in range(passes):
                recs = await asyncio.gather(*[_one(engine, speech, decoder, req, ramp) for _ in range(STREAMS)])
                concurrent.append(list(recs))
                log(f"pass {p + 1}/{passes} {STREAMS} streams: worst RTF {max(r['rtf'] for r in recs):.3f}")
            codes, talker_s = await _talker_alone(engine, speech, req)
        finally:
            engine.shutdown()
        codec = decoder.codec
        decoder.close()
        t1 = time.perf_counter()
        streamed = codec_stream.decode_streamed(codec, codes, ramp)
        codec_s = time.perf_counter() - t1
        offline = codec.decode(codes)
        stateful = codec_stream.boundary_error(streamed, offline)
        curve = []
        for left in LEFT_CONTEXTS:
            err = codec_stream.boundary_error(
                codec_stream.decode_with_left_context(codec, codes, ramp, left_context=left), offline)
            curve.append({"left_context_frames": left, "max_abs_err_rel_peak": err.max_rel,
                          "snr_db": None if err.snr_db == float("inf") else round(err.snr_db, 2)})
    facts = codec.facts
    audio_s = codes.shape[2] / facts.frame_rate
    worst = [max(r["rtf"] for r in recs) for recs in concurrent]
    ttfa = {name: _median([r["ttfa_s"] for r in recs]) for name, recs in arms.items()}
    return {
        "benchmark": "speech",
        "model": {"dir": model_dir.name, "speech": speech.describe()},
        "codec": {"source": facts.source, "synthetic": facts.synthetic, "sample_rate": facts.sample_rate,
                  "frame_rate": facts.frame_rate, "n_q": facts.n_q, "codebook_size": facts.codebook_size,
                  "receptive_field_frames": facts.receptive_field_frames},
        "text": text, "voice": req.voice, "passes": passes, "enforce_eager": enforce_eager,
        "schedule": {"ramp": dataclasses.asdict(ramp), "no_ramp": dataclasses.asdict(no_ramp)},
        "ready_s": round(ready_s, 2),
        "ttfa_s": ttfa,
        "ttfa_ratio_ramp_over_no_ramp": (round(ttfa["ramp"] / ttfa["no_ramp"], 4)
                                         if ttfa["ramp"] and ttfa["no_ramp"] else None),
        "first_frame_s": _median([r["first_frame_s"] for r in arms["ramp"]]),
        "rtf": _median([r["rtf"] for r in arms["ramp"]]),
        "rtf_no_ramp": _median([r["rtf"] for r in arms["no_ramp"]]),
        "rtf_4_streams": _median(worst),
        "rtf_4_streams_each": [[round(r["rtf"], 4) for r in recs] for recs in concurrent],
        "passes_detail": arms,
        "shares": {"frames": int(codes.shape[2]), "audio_s": round(audio_s, 3),
                   "talker_alone_s": round(talker_s, 3), "codec_alone_s": round(codec_s, 3),
                   "talker_share": round(talker_s / (talker_s + codec_s), 3),
                   "codec_share": round(codec_s / (talker_s + codec_s), 3)},
        "boundary_max_abs_err": stateful.max_rel,
        "boundary_snr_db": None if stateful.snr_db == float("inf") else round(stateful.snr_db, 2),
        "boundary_route": "stateful (the default: conv states and the transformer's KV carried between chunks)",
        "boundary_curve_stateless": curve,
        "peak_tree_rss_anon_mb": round(peak.peak_mb, 1),
    }


def measure(model_dir: str | Path, *, passes: int = 3, text: str = DEFAULT_TEXT, voice: str | None = None,
            enforce_eager: bool = False, log=print) -> dict:
    """The measurements above for the speech model in ``model_dir``, with provenance."""
    from vllm_edge.common import provenance

    if passes < 1:
        raise ValueError("passes must be at least 1")
    prov = provenance.collect(model=str(model_dir))  # the code and the host as the run began
    result = asyncio.run(_measure(Path(model_dir), passes=passes, text=text, voice=voice,
                                  enforce_eager=enforce_eager, log=log))
    result["provenance"] = {**prov, "loadavg_end": list(os.getloadavg())}
    return result
