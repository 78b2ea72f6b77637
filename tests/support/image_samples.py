"""Images made on the spot for the image tests, and the bad image requests every front end
must refuse (shared by the validator, the serve middleware and the real-server tests)."""

from __future__ import annotations

import base64
import functools
import io
import os
import struct
import zlib

from PIL import Image


def picture(w: int = 40, h: int = 30, mode: str = "RGB") -> Image.Image:
    img = Image.new(mode, (w, h))
    img.putdata([((x * 7) % 256, (y * 11) % 256, (x * y) % 256)[: len(mode)] if mode != "L"
                 else (x + y) % 256 for y in range(h) for x in range(w)])
    return img


def encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def solid_png(w: int = 64, h: int = 48) -> bytes:
    """A valid one-colour RGB PNG."""
    return encode(Image.new("RGB", (w, h), (10, 200, 30)), "PNG")


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@functools.lru_cache(maxsize=4)
def blank_png(w: int, h: int) -> bytes:
    """A valid grayscale PNG of any size in a few KB, written without allocating the pixels
    (PIL would need w*h bytes): its header says w x h, its data is all zero rows."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    comp = zlib.compressobj(9)
    rows = b"\0" * (w + 1) * 64  # 64 rows of (filter byte + w gray pixels)
    idat = b"".join(comp.compress(rows[: (w + 1) * min(64, h - y)]) for y in range(0, h, 64))
    idat += comp.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def chat(*urls: str, text: str = "What is in this picture?", model: str = "smolvlm-135m",
         max_tokens: int = 8) -> dict:
    """An OpenAI chat request with ``urls`` as image_url parts before the text."""
    content = [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
               {"type": "text", "text": text}]
    return {"model": model, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}


def good_url() -> str:
    return data_url(encode(picture(64, 48), "PNG"), "image/png")


def noise_png(min_bytes: int) -> bytes:
    """A real PNG of at least ``min_bytes`` (random pixels do not compress)."""
    side = int((min_bytes / 3) ** 0.5) + 16
    return encode(Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)), "PNG")


def bad_requests(max_images: int, max_bytes: int) -> dict[str, tuple[dict, int, str]]:
    """name -> (request body, HTTP status, text the error message must contain), for a
    server whose VLLM_EDGE_MAX_IMAGES and VLLM_EDGE_MAX_IMAGE_BYTES are these and whose
    pixel limit is the default (4096 x 4096)."""
    png = encode(picture(64, 48), "PNG")
    huge = blank_png(10000, 10000)  # 10^8 pixels, about 100 KB
    return {
        "truncated_png": (chat(data_url(png[: len(png) // 2], "image/png")), 400,
                          "corrupt or truncated PNG"),
        "garbage_bytes": (chat(data_url(b"this is not an image at all " * 20, "image/png")), 415,
                          "not a recognisable image"),
        "tiff": (chat(data_url(encode(picture(), "TIFF"), "image/tiff")), 415,
                 "'image/tiff' is not supported"),
        "tiff_labelled_png": (chat(data_url(encode(picture(), "TIFF"), "image/png")), 415,
                              "format TIFF is not supported"),
        "over_pixel_limit": (chat(data_url(huge, "image/png")), 413,
                             "10000x10000 = 100000000 pixels, over the limit"),
        "over_byte_limit": (chat(data_url(noise_png(max_bytes + 1), "image/png")), 413,
                            "VLLM_EDGE_MAX_IMAGE_BYTES"),
        "invalid_base64": (chat("data:image/png;base64,@@not base64@@"), 400, "invalid base64"),
        "too_many_images": (chat(*[good_url()] * (max_images + 1)), 400,
                            f"{max_images + 1} images in one prompt; the limit is {max_images}"),
        "file_path": (chat("/etc/hostname"), 400, "only data:image/...;base64 URLs"),
    }
