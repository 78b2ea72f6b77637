"""`speak` and /v1/audio/speech on the embedded speech model (eager), in order: `speak --out`
writes a WAV as the server streams it; the same server streams a WAV to a plain HTTP client,
refuses bad requests by field before any audio and the route without its key; `speak` refuses
to replace a file it did not write; `stop` ends the server."""

from __future__ import annotations

import wave

import httpx
import pytest

from support.cli_runner import run_cli

pytestmark = pytest.mark.slow
SAY = ["--enforce-eager", "--keep-alive", "10m"]


def _record() -> dict:
    from vllm_edge.serving import keepalive

    (rec,) = [r for r, _ in keepalive.records() if r.model == "speech"]
    return rec


@pytest.fixture(scope="module")
def spoken(default_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("speak") / "hello.wav"
    proc = run_cli("speak", "Hello from the edge.", "--out", str(out), *SAY, timeout=1800)
    yield proc, out
    run_cli("stop", "speech", timeout=300)


def test_speak_writes_a_wav_as_it_streams(spoken):
    proc, out = spoken
    assert proc.returncode == 0, proc.stderr[-3000:]
    with wave.open(str(out), "rb") as w:
        rate, frames = w.getframerate(), w.getnframes()
        pcm = w.readframes(frames)
    # Mimi's rate, whole 1920-sample frames, and audio that is not silence
    assert rate == 24000 and frames > 0 and frames % 1920 == 0
    assert any(pcm[i:i + 2] != b"\0\0" for i in range(0, len(pcm), 2))
    assert "first audio" in proc.stderr and "real-time factor" in proc.stderr


def test_the_route_streams_a_wav_and_refuses_by_field(spoken):
    rec = _record()
    url = f"{rec.url}/v1/audio/speech"
    with httpx.stream("POST", url, json={"input": "One, two, three.", "voice": "brook"},
                      headers=rec.headers, timeout=600) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "audio/wav"
        pieces = list(resp.iter_bytes())
    body = b"".join(pieces)
    assert body[:4] == b"RIFF" and len(body) > 44 + 1920 * 2
    # the streamed header's sizes are unknown; the samples after it are whole
    assert (len(body) - 44) % (1920 * 2) == 0
    for bad, param in (({"input": ""}, "input"), ({"input": "hi", "voice": "nova"}, "voice"),
                       ({"input": "hi", "response_format": "mp3"}, "response_format")):
        r = httpx.post(url, json=bad, headers=rec.headers, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert httpx.post(url, json={"input": "hi"}, timeout=60).status_code == 401


def test_speak_refuses_a_file_it_did_not_write(spoken, tmp_path):
    theirs = tmp_path / "theirs.wav"
    with wave.open(str(theirs), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\1\0" * 100)
    before = theirs.read_bytes()
    proc = run_cli("speak", "Overwrite?", "--out", str(theirs), *SAY, timeout=600)
    assert proc.returncode != 0 and "vllm-edge did not write" in proc.stderr
    assert theirs.read_bytes() == before
    _, ours = spoken  # its own file it may replace
    assert run_cli("speak", "Again.", "--out", str(ours), *SAY, timeout=600).returncode == 0
    with wave.open(str(ours), "rb") as w:
        assert w.getnframes() > 0


def test_stop_ends_the_speech_server(spoken):
    rec = _record()
    proc = run_cli("stop", "speech", timeout=300)
    assert proc.returncode == 0 and f"pid {rec.pid}" in proc.stdout

