"""`vllm-edge speak`: text to speech through a keep-alive model server, written as it streams."""

from __future__ import annotations

import argparse
import sys

from vllm_edge.cli.args import add_model

NAME = "speak"
HELP = "say TEXT with a speech model: a WAV file (--out) or audio on a pipe, streamed"
DESCRIPTION = (
    "The text goes to the speech model's keep-alive server (started if none is up, as `run` "
    "does) on OpenAI's /v1/audio/speech, and the audio is written as it is decoded. With no "
    "--model, the embedded speech checkpoint: synthetic codec and talker weights at real shapes, "
    "so the audio is noise and the timings are real (docs/guide/speech.md). --out never replaces "
    "a file `speak` did not write.")
DEFAULT_MODEL = "speech"
WAV_STREAM_HEADER = 44  # the server's streamed WAV header, before the samples


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="?", default=None, help="what to say (default: stdin)")
    add_model(p, default=DEFAULT_MODEL,
              help="a speech model: 'speech' (the embedded one, built on first use) or its folder")
    p.add_argument("--voice", default=None, help="one of the model's voices (default: its first)")
    p.add_argument("--out", "-o", default=None, metavar="FILE",
                   help="a WAV file to write (default: the audio on stdout, which must be a pipe)")
    p.add_argument("--format", choices=("wav", "pcm"), default="wav",
                   help="on stdout: a streamed WAV, or bare 16-bit little-endian PCM (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace --out even if `speak` did not write it")
    p.add_argument("--keep-alive", default="5m", metavar="DURATION",
                   help="how long the server stays loaded after the last request (default: %(default)s)")
    p.add_argument("--enforce-eager", action="store_true", help="skip torch.compile")


def run(args: argparse.Namespace) -> int:
    import time

    from vllm_edge.common.errors import UsageError
    from vllm_edge.common.procmem import process_start_epoch
    from vllm_edge.serving import keepalive, startup_phases

    started = process_start_epoch()
    text = args.text
    if text is None:
        if sys.stdin.isatty():
            raise UsageError("give the TEXT to say, or pipe it on stdin")
        text = sys.stdin.read()
    if not text.strip():
        raise UsageError("nothing to say: the text is empty")
    if args.out is None and sys.stdout.isatty():
        raise UsageError("audio on a terminal: give --out FILE.wav, or pipe stdout to a player "
                         "(`vllm-edge speak ... | aplay`)")
    destination = None
    if args.out is not None:
        from vllm_edge.common import atomic, wavfile

        # refused before the model loads: nothing is lost, nothing is waited for
        destination = atomic.check_destination(args.out, force=args.force, is_ours=wavfile.written_by_us)
    keep_s = keepalive.parse_duration(args.keep_alive) or 300.0
    display = startup_phases.Display(sys.stderr, sys.stderr.isatty())
    t0 = time.time()
    rec, new = keepalive.ensure(args.model, "auto", keep_s, {"enforce_eager": args.enforce_eager,
                                                              "max_num_seqs": 4},
                                progress=display, say=lambda m: print(f"[vllm-edge] {m}", file=sys.stderr))
    how = f"started, ready in {time.time() - t0:.1f} s" if new else "reused"
    keepalive.verify(rec)
    body = {"input": text, "response_format": "pcm" if destination else args.format}
    if args.voice is not None:
        body["voice"] = args.voice
    got = _stream(rec, body, destination, args.force, sys.stdout.buffer)
    first = f"{got['first_byte_at'] - started:.2f} s" if got.get("first_byte_at") else "n/a"
    audio_s = got["samples"] / got["rate"] if got["rate"] else 0.0
    wall = time.time() - (got.get("request_at") or time.time())
    rtf = f"{wall / audio_s:.2f}" if audio_s else "n/a"
    where = f" -> {destination}" if destination else ""
    print(f"--- server pid {rec.pid} ({how}) | first audio {first} after the command | "
          f"{audio_s:.2f} s of audio in {wall:.2f} s (real-time factor {rtf}){where}", file=sys.stderr)
    return 0


def _stream(rec, body: dict, destination, force: bool, stdout) -> dict:
    """POST the request and write the audio as it arrives: to ``destination`` (a WAV file,
    renamed into place when complete) or to ``stdout``."""
    import json
    import time

    import httpx

    from vllm_edge.common import atomic, wavfile
    from vllm_edge.common.errors import EdgeError

    got = {"samples": 0, "rate": 0, "request_at": time.time()}
    with httpx.stream("POST", f"{rec.url}/v1/audio/speech", json=body, headers=rec.headers,
                      timeout=httpx.Timeout(30.0, read=600.0)) as resp:
        if resp.status_code != 200:
            resp.read()
            try:
                msg = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = resp.text[:500]
            raise EdgeError(f"the speech server answered {resp.status_code}: {msg}")
        got["rate"] = int(resp.headers.get("x-sample-rate") or 0)
        if destination is None:
            n = 0
            for chunk in resp.iter_bytes():
                got.setdefault("first_byte_at", time.time())
                stdout.write(chunk)
                stdout.flush()
                n += len(chunk)
            got["samples"] = max(0, n - (WAV_STREAM_HEADER if body["response_format"] == "wav" else 0)) // 2
            return got
        if not got["rate"]:
            raise EdgeError(f"the speech server sent no sample rate: {json.dumps(dict(resp.headers))[:300]}")
        with atomic.file_path(destination, force=force, is_ours=wavfile.written_by_us) as tmp:
            with open(tmp, "wb") as f:
                w = wavfile.Writer(f, got["rate"])
                for chunk in resp.iter_bytes():
                    got.setdefault("first_byte_at", time.time())
                    w.write(chunk)
                w.close()
                got["samples"] = w.data_bytes // 2
    return got
