"""The /v1/audio/speech request: every refusal names its field, before any audio."""

from __future__ import annotations

import pytest

from vllm_edge.serving.speech import MAX_INPUT_CHARS, SpeechError, parse_request

VOICES = ["alba", "brook"]


def test_a_good_request_defaults_to_the_first_voice_and_wav():
    req = parse_request({"model": "x", "input": "Hello there."}, VOICES)
    assert (req.text, req.voice, req.response_format) == ("Hello there.", "alba", "wav")
    assert parse_request({"input": "hi", "voice": {"id": "brook"}, "response_format": "pcm"},
                         VOICES).voice == "brook"


@pytest.mark.parametrize("body, param, words", [
    ({"input": ""}, "input", "non-empty"),
    ({"input": "   "}, "input", "non-empty"),
    ({"input": 3}, "input", "non-empty"),
    ({"input": "x" * (MAX_INPUT_CHARS + 1)}, "input", "limit"),
    ({"input": "hi", "voice": "nova"}, "voice", "alba, brook"),
    ({"input": "hi", "response_format": "mp3"}, "response_format", "encoder"),
    ({"input": "hi", "response_format": "ogg"}, "response_format", "unknown"),
    ({"input": "hi", "speed": 1.5}, "speed", "1.0"),
    ({"input": "hi", "stream_format": "sse"}, "stream_format", "audio"),
])
def test_bad_fields_are_refused_by_name(body, param, words):
    with pytest.raises(SpeechError, match=words) as err:
        parse_request(body, VOICES)
    assert err.value.status == 400 and err.value.param == param


def test_a_body_that_is_not_an_object_or_names_another_model():
    with pytest.raises(SpeechError, match="JSON object"):
        parse_request(["input"], VOICES)
    with pytest.raises(SpeechError) as err:
        parse_request({"model": "other", "input": "hi"}, VOICES, served=["speech"])
    assert err.value.status == 404
