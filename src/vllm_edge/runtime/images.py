"""Image inputs for the multimodal edge path: load, validate and limit them before any
engine sees them, with errors a person can act on.

One module for every front end: ``vllm-edge run --image PATH`` calls :func:`load` and
:func:`check_count`; a server calls :func:`validate_openai_messages` on a chat request
and maps :class:`ImageInputError` to ``status`` (400, 413 or 415).

Accepted sources: a file path and a ``data:image/...;base64,`` URL. Remote URLs are
refused: the edge path is offline, and fetching on a user's behalf is a network side
effect the server should not have.

Checks, cheapest first, so a bad input costs no decode: byte size (from ``stat`` or the
base64 length) -> container format -> pixel count (from the header) -> full decode
(which catches truncated or corrupt data).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from vllm_edge.common.errors import EdgeError

# PIL format names; what the Idefics3/SmolVLM processor (and vLLM's loader) read without
# extra codecs. TIFF, ICO, PSD... are refused with a clear message.
SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_MIME = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP",
         "image/gif": "GIF", "image/bmp": "BMP"}
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?)(?P<b64>;base64)?,",
                       re.IGNORECASE)


class ImageInputError(EdgeError, ValueError):
    """A bad image input. ``status`` is the HTTP status a server should answer with:
    400 (corrupt, truncated, malformed, too many), 413 (too large), 415 (format)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param  # the request field at fault, e.g. messages[0].content[1]


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 << 20
    max_pixels: int = 4096 * 4096
    max_images: int = 4
    formats: tuple[str, ...] = SUPPORTED_FORMATS

    @classmethod
    def from_env(cls) -> "ImageLimits":
        from vllm_edge import envs

        lim = cls(max_bytes=envs.get("VLLM_EDGE_MAX_IMAGE_BYTES"),
                  max_pixels=envs.get("VLLM_EDGE_MAX_IMAGE_PIXELS"),
                  max_images=envs.get("VLLM_EDGE_MAX_IMAGES"))
        for name, v in (("VLLM_EDGE_MAX_IMAGE_BYTES", lim.max_bytes),
                        ("VLLM_EDGE_MAX_IMAGE_PIXELS", lim.max_pixels)):
            if v < 1:
                raise ValueError(f"{name}={v}: must be at least 1")
        if lim.max_images < 0:
            raise ValueError(f"VLLM_EDGE_MAX_IMAGES={lim.max_images}: must be at least 0")
        return lim


@dataclass
class LoadedImage:
    image: Any = field(repr=False)  # PIL.Image.Image, RGB, fully decoded
    source: str
    format: str
    width: int
    height: int
    nbytes: int


def describe(source: str) -> str:
    """A short name for messages: a data URL is not echoed back in full."""
    if source.startswith("data:"):
        return f"data URL ({source[:source.find(',') + 1][:48]}…, {len(source)} chars)"
    return source


def _size_mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _read_source(source: str, limits: ImageLimits) -> tuple[bytes, str | None]:
    """The encoded bytes, and the format a data URL declares (if any)."""
    if source.startswith("data:"):
        m = _DATA_URL.match(source)
        if not m or not m.group("b64"):
            raise ImageInputError(f"{describe(source)}: not a base64 data URL; expected "
                                  "data:image/<type>;base64,<data>")
        mime = (m.group("mime") or "").lower()
        declared = _MIME.get(mime)
        if declared is None or declared not in limits.formats:
            raise ImageInputError(
                f"{describe(source)}: media type {mime or '(none)'!r} is not supported; "
                f"supported: {', '.join(limits.formats)}", status=415)
        payload = source[m.end():]
        if len(payload) * 3 // 4 > limits.max_bytes + 3:  # before decoding anything
            raise ImageInputError(
                f"{describe(source)}: about {_size_mb(len(payload) * 3 // 4)} of image data, over "
                f"the limit of {_size_mb(limits.max_bytes)} (VLLM_EDGE_MAX_IMAGE_BYTES)", status=413)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageInputError(f"{describe(source)}: invalid base64 data ({exc})") from None
        return data, declared
    if re.match(r"^[a-z][a-z0-9+.-]*://", source, re.IGNORECASE):
        raise ImageInputError(f"{source}: remote image URLs are not fetched (the edge path is "
                              "offline); pass a file path or a data:image/...;base64 URL")
    path = Path(source).expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ImageInputError(f"{source}: no such image file") from None
    except OSError as exc:
        raise ImageInputError(f"{source}: cannot read the image file ({exc.strerror})") from None
    if not path.is_file():
        raise ImageInputError(f"{source}: not a regular file")
    if st.st_size > limits.max_bytes:
        raise ImageInputError(
            f"{source}: {_size_mb(st.st_size)}, over the limit of {_size_mb(limits.max_bytes)} "
            "(VLLM_EDGE_MAX_IMAGE_BYTES)", status=413)
    if st.st_size == 0:
        raise ImageInputError(f"{source}: empty file, not an image")
    try:
        return path.read_bytes(), None
    except OSError as exc:
        raise ImageInputError(f"{source}: cannot read the image file ({exc.strerror})") from None


def load(source: str | os.PathLike, limits: ImageLimits | None = None) -> LoadedImage:
    """Load and fully decode one image from a path or a data URL; return it as RGB."""
    from PIL import Image, UnidentifiedImageError

    limits = limits or ImageLimits.from_env()
    source = str(source)
    name = describe(source)
    data, declared = _read_source(source, limits)
    if len(data) > limits.max_bytes:
        raise ImageInputError(f"{name}: {_size_mb(len(data))}, over the limit of "
                              f"{_size_mb(limits.max_bytes)} (VLLM_EDGE_MAX_IMAGE_BYTES)", status=413)
    try:
        img = Image.open(io.BytesIO(data), formats=None)
    except UnidentifiedImageError:
        raise ImageInputError(
            f"{name}: not a recognisable image (corrupt, or not an image at all); supported "
            f"formats: {', '.join(limits.formats)}", status=415) from None
    except Image.DecompressionBombError as exc:
        raise ImageInputError(f"{name}: {exc}", status=413) from None
    except (OSError, ValueError) as exc:
        # ValueError: PIL's header parsers raise it too (a truncated PNG IHDR, a PNG text or ICC
        # chunk that inflates past MAX_TEXT_CHUNK, a PPM size that is not a number)
        raise ImageInputError(f"{name}: cannot decode the image header ({exc})") from None
    fmt = (img.format or "").upper()
    if fmt not in limits.formats:
        raise ImageInputError(f"{name}: format {fmt or 'unknown'} is not supported; supported: "
                              f"{', '.join(limits.formats)}", status=415)
    if declared and declared != fmt:
        raise ImageInputError(f"{name}: the data URL says {declared} but the data is {fmt}",
                              status=415)
    width, height = img.size
    if width < 1 or height < 1:
        raise ImageInputError(f"{name}: empty image ({width}x{height})")
    if width * height > limits.max_pixels:
        raise ImageInputError(
            f"{name}: {width}x{height} = {width * height} pixels, over the limit of "
            f"{limits.max_pixels} (VLLM_EDGE_MAX_IMAGE_PIXELS)", status=413)
    try:
        img.load()  # a truncated or corrupt body fails here, not inside the engine
        rgb = img.convert("RGB")
    except Image.DecompressionBombError as exc:
        raise ImageInputError(f"{name}: {exc}", status=413) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageInputError(f"{name}: corrupt or truncated {fmt} data ({exc})") from None
    return LoadedImage(rgb, source, fmt, width, height, len(data))


def check_count(n: int, limits: ImageLimits, *, model: str | None = None,
                accepts_images: bool = True) -> None:
    """Refuse more images than the model (0 for a text-only one) or the limit allows."""
    if n and not accepts_images:
        raise ImageInputError(f"{model or 'the model'} takes no images (it has no vision "
                              f"encoder); got {n}")
    if n > limits.max_images:
        raise ImageInputError(f"{n} images in one prompt; the limit is {limits.max_images} "
                              "(VLLM_EDGE_MAX_IMAGES)")


def model_accepts_images(model_dir: str | os.PathLike) -> bool:
    from vllm_edge.common import model_config

    try:
        cfg = model_config.read(Path(model_dir))
    except model_config.ModelConfigError:
        return False
    return "vision_config" in cfg


def _image_urls(messages: Iterable[dict]) -> list[tuple[str, str]]:
    """(where, url) for each ``image_url`` part, in order."""
    urls: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            where = f"messages[{i}].content[{j}]"
            if not isinstance(url, str) or not url:
                raise ImageInputError(f"{where}: image_url has no url", param=where)
            urls.append((where, url))
    return urls


def validate_openai_messages(messages: Iterable[dict], limits: ImageLimits | None = None, *,
                             model: str | None = None, accepts_images: bool = True) -> list[LoadedImage]:
    """Check every ``image_url`` part of an OpenAI chat request (count first, then each
    image)."""
    return validate_image_urls(_image_urls(messages), limits, model=model,
                               accepts_images=accepts_images)


def validate_image_urls(urls: list[tuple[str, Any]], limits: ImageLimits | None = None, *,
                        model: str | None = None, accepts_images: bool = True) -> list[LoadedImage]:
    """Check (where, url) image references of a request: the count first, then each image.
    Only data URLs are accepted: a server must not read its own files or fetch for a
    client. Errors carry the part at fault in ``param`` and at the start of the message."""
    limits = limits or ImageLimits.from_env()
    try:
        check_count(len(urls), limits, model=model, accepts_images=accepts_images)
    except ImageInputError as exc:
        raise ImageInputError(str(exc), exc.status, param="messages") from None
    out = []
    for where, url in urls:
        try:
            if not isinstance(url, str) or not url:
                raise ImageInputError("the image part has no url")
            if not url.startswith("data:"):
                raise ImageInputError(f"{describe(url)}: only data:image/...;base64 URLs are "
                                      "accepted by the server (no file paths, no remote fetches)")
            out.append(load(url, limits))
        except ImageInputError as exc:
            raise ImageInputError(f"{where}: {exc}", exc.status, param=where) from None
    return out


def to_data_url(path: str | os.PathLike) -> str:
    """A file as a data URL (its own bytes, type from its format), e.g. for a client."""
    from PIL import Image

    data = Path(path).read_bytes()
    with Image.open(io.BytesIO(data)) as img:
        fmt = (img.format or "PNG").lower()
    return f"data:image/{fmt};base64," + base64.b64encode(data).decode("ascii")
