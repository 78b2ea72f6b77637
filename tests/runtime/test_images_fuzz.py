"""A seeded fuzz of the server's image check, validate_openai_messages: request-like message lists
(parsed from JSON, as the server gets them) whose image parts carry data URLs that are mutated
(images cut or with bytes changed, header sizes made huge, unsupported formats, a wrong or missing
media type, bad base64, file paths and remote URLs) next to parts and messages of the wrong shape.

Each request either passes or raises ImageInputError with status 400, 413 or 415 and the part at
fault in ``param`` (and at the start of the message, but for the count, which is about the whole
list); never another exception, never past a deadline. The targeted tests below are the cases the
fuzz found."""

from __future__ import annotations

import base64
import io
import json
import random
import struct
import traceback
import zlib
from collections import Counter

import pytest
from PIL import Image

from support import fuzz
from support.image_samples import blank_png, data_url, encode, picture
from vllm_edge.runtime.images import ImageInputError, ImageLimits, validate_openai_messages

SEED = 8191
CASES = 5000
DEADLINE = 10.0
LIMITS = ImageLimits(max_bytes=200_000, max_pixels=1 << 20, max_images=3)
STATUSES = {400, 413, 415}
MIMES = ["image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp", "image/tiff",
         "IMAGE/PNG", "image/png;charset=utf-8", "text/plain", "image/", ""]
MIME_OF = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif",
           "BMP": "image/bmp"}


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _text_bomb(png: bytes) -> bytes:
    """``png`` with a 2 KB zTXt chunk that inflates to 2 MiB, past PIL's MAX_TEXT_CHUNK."""
    return png[:33] + _chunk(b"zTXt", b"k\0\0" + zlib.compress(b"a" * (2 << 20))) + png[33:]


def _animated_gif() -> bytes:
    buf = io.BytesIO()
    picture(8, 8).save(buf, "GIF", save_all=True, append_images=[picture(8, 8, "L").convert("RGB")])
    return buf.getvalue()


@pytest.fixture(scope="module")
def samples() -> dict[str, bytes]:
    """Small valid images of every supported format and a few variants, three unsupported ones."""
    out = {fmt: encode(picture(24, 16), fmt) for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF",
                                                         "ICO", "PPM")}
    out["PNG palette"] = encode(picture(24, 16).convert("P"), "PNG")
    out["PNG 16-bit"] = encode(Image.new("I;16", (8, 8)), "PNG")
    out["GIF animated"] = _animated_gif()
    out["PNG text bomb"] = _text_bomb(out["PNG"])
    return out


def _image(rng: random.Random, samples: dict[str, bytes]) -> tuple[str, bytes, str]:
    """(what, bytes, the media type that goes with them)."""
    name = rng.choice(list(samples))
    data = samples[name]
    mime = MIME_OF.get(name.split()[0], "image/png")
    edit = rng.choice(["none"] * 4 + ["cut", "flip", "flip", "flip header", "huge size", "junk", "empty", "large"])
    if edit == "cut":
        data = fuzz.truncate(data, rng)
    elif edit == "flip":
        data = fuzz.flip(data, rng, n=rng.randint(1, 8))
    elif edit == "flip header":
        data = fuzz.flip(data, rng, 0, min(64, len(data)), n=rng.randint(1, 4))
    elif edit == "huge size":  # the width and height fields of the container's header
        w = rng.choice([0, 1, 2**15, 2**16 - 1, 2**31 - 1, 2**32 - 1])
        h = rng.choice([0, 1, 2**16 - 1, 2**31 - 1])
        if name.startswith("PNG"):
            data = fuzz.put(fuzz.put(data, 16, ">I", w), 20, ">I", h)
        elif name == "BMP":
            data = fuzz.put(fuzz.put(data, 18, "<i", w - 2**31 if w >= 2**31 else w), 22, "<i", -h)
        elif name.startswith("GIF"):
            data = fuzz.put(fuzz.put(data, 6, "<H", w & 0xFFFF), 8, "<H", h & 0xFFFF)
        else:
            data = fuzz.flip(data, rng, 0, min(32, len(data)), n=3)
    elif edit == "junk":
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif edit == "empty":
        data = b""
    elif edit == "large":  # a few KB that decode to past the pixel limit
        name, data, mime = "PNG", blank_png(rng.choice([1200, 5000]), rng.choice([900, 3000])), "image/png"
    return f"{name} {edit}", data, mime


def _url(rng: random.Random, samples: dict[str, bytes]) -> tuple[str, str]:
    what, data, mime = _image(rng, samples)
    if rng.random() < 0.3:
        mime = rng.choice(MIMES)
    b64 = base64.b64encode(data).decode()
    form = rng.choice(["good"] * 6 + ["no base64 flag", "bad char", "padding", "whitespace", "non-ASCII",
                                      "no comma", "cut base64", "path", "remote"])
    url = {"good": f"data:{mime};base64,{b64}", "no base64 flag": f"data:{mime},{b64}",
           "bad char": f"data:{mime};base64,{b64[:5]}!{b64[5:]}", "padding": f"data:{mime};base64,{b64}====",
           "whitespace": f"data:{mime};base64, {b64}\n", "non-ASCII": f"data:{mime};base64,{b64}\u00e9",
           "no comma": f"data:{mime};base64", "cut base64": f"data:{mime};base64,{b64[:-rng.randint(1, 3)]}",
           "path": "/etc/hostname", "remote": "http://127.0.0.1/cat.png"}[form]
    return f"{what}, {mime or 'no type'}, {form}", url


def _part(rng: random.Random, samples: dict[str, bytes]) -> tuple[str, object]:
    r = rng.random()
    if r < 0.7:
        what, url = _url(rng, samples)
        shape = rng.choice(["object"] * 5 + ["bare string", "with detail", "no url key", "url not a string"])
        if shape == "object":
            return what, {"type": "image_url", "image_url": {"url": url}}
        if shape == "bare string":
            return what, {"type": "image_url", "image_url": url}
        if shape == "with detail":
            return what, {"type": "image_url", "image_url": {"url": url, "detail": fuzz.junk(rng)}}
        if shape == "no url key":
            return shape, {"type": "image_url", "image_url": {"uri": url}}
        return shape, {"type": "image_url", "image_url": {"url": fuzz.junk(rng)}}
    if r < 0.85:
        return "text", {"type": "text", "text": "What is in this picture?"}
    return "junk part", fuzz.junk(rng)


def _messages(rng: random.Random, samples: dict[str, bytes]) -> tuple[list[str], list]:
    whats, messages = [], []
    for _ in range(rng.randint(1, 2)):
        r = rng.random()
        if r < 0.85:
            parts = [_part(rng, samples) for _ in range(rng.randint(0, 3))]
            whats += [w for w, _ in parts]
            messages.append({"role": rng.choice(["user", "system", 5]), "content": [p for _, p in parts]})
        elif r < 0.93:
            messages.append({"role": "user", "content": fuzz.junk(rng)})
        else:
            messages.append(fuzz.junk(rng))
    return whats, json.loads(json.dumps(messages))  # what the server's JSON parse hands over


def _check(messages: list, what: str) -> tuple[str, str | None]:
    """(the outcome: "passed" or the status, what broke the contract on this request or None)."""
    try:
        with fuzz.memory_cap(), fuzz.deadline(DEADLINE, what):
            images = validate_openai_messages(messages, LIMITS)
    except ImageInputError as exc:
        if exc.status not in STATUSES:
            return "broke", f"status {exc.status}: {exc}"
        # a count error is about the whole list ("messages"); any other names its part first
        if not exc.param or exc.param != "messages" and not str(exc).startswith(f"{exc.param}: "):
            return "broke", f"the error does not name the part at fault (param {exc.param!r}): {exc}"
        return str(exc.status), None
    except BaseException as exc:  # the contract under test: nothing else may escape
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return "broke", f"{type(exc).__name__}: {str(exc)[:300]} (at {where.filename}:{where.lineno})"
    return ("passed with images" if images else "passed"), None


@pytest.mark.filterwarnings("ignore")  # PIL warns about the corrupt TIFF tags and big images it is fed
def test_mutated_image_requests_pass_or_get_a_4xx(samples):
    rng = random.Random(SEED)
    failures, outcomes = [], Counter()
    for i in range(CASES):
        whats, messages = _messages(rng, samples)
        outcome, why = _check(messages, f"request {i}")
        outcomes[outcome] += 1
        if why:
            failures.append(f"request {i} ({'; '.join(whats)}): {why}")
    assert not failures, f"{len(failures)} of {CASES} requests broke the contract:\n" + "\n".join(failures)
    # every answer is reached, decoded images included
    assert all(outcomes[k] >= 20 for k in ("passed with images", "400", "413", "415")), outcomes


# --- what the fuzz found: PIL's header parsers raise ValueError, which escaped -------------------


def _one(data: bytes, mime: str = "image/png") -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(data, mime)}}]}]


@pytest.mark.parametrize("case", ["text bomb", "short IHDR", "PPM size not a number"])
def test_a_header_pil_cannot_parse_is_a_400(case):
    png = encode(picture(24, 16), "PNG")
    data = {"text bomb": _text_bomb(png),
            "short IHDR": fuzz.put(png, 8, ">I", 4),  # the IHDR chunk's length
            "PPM size not a number": b"P6\nx 2\n255\n" + b"\0" * 12}[case]
    with pytest.raises(ImageInputError, match=r"^messages\[0\].content\[0\]: data URL .*: cannot decode the "
                                              r"image header") as e:
        validate_openai_messages(_one(data), LIMITS)
    assert e.value.status == 400 and e.value.param == "messages[0].content[0]"
