"""Image inputs: every bad input gets a clear error naming it, with the HTTP status a
server should answer; good inputs of every supported format decode to RGB."""

from __future__ import annotations

import base64

import pytest

from support.image_samples import bad_requests, data_url, encode, picture
from vllm_edge.runtime import images
from vllm_edge.runtime.images import ImageInputError, ImageLimits


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_supported_formats_load_as_rgb(tmp_path, fmt):
    f = tmp_path / f"x.{fmt.lower()}"
    f.write_bytes(encode(picture(), fmt))
    got = images.load(f, ImageLimits())
    assert (got.format, got.width, got.height) == (fmt, 40, 30)
    assert got.image.mode == "RGB" and got.image.size == (40, 30)


def test_pixels_survive_a_lossless_round_trip(tmp_path):
    img = picture()
    f = tmp_path / "x.png"
    f.write_bytes(encode(img, "PNG"))
    assert images.load(f, ImageLimits()).image.tobytes() == img.tobytes()


def test_rgba_and_grayscale_become_rgb(tmp_path):
    for mode in ("RGBA", "L"):
        f = tmp_path / f"{mode}.png"
        f.write_bytes(encode(picture(mode=mode), "PNG"))
        assert images.load(f, ImageLimits()).image.mode == "RGB"


def test_data_url_loads(tmp_path):
    url = data_url(encode(picture(), "PNG"), "image/png")
    got = images.load(url, ImageLimits())
    assert got.format == "PNG" and got.image.size == (40, 30)
    assert "data URL" in got.source or got.source.startswith("data:")


# The shared bad-request cases whose fault is in the image bytes, so a file carries it too
# (the others are about the URL or the request: media type, base64, path URL, count), with
# the file each is written to (the loader goes by the bytes, not the extension).
FILE_CASES = {"truncated_png": "cut.png", "garbage_bytes": "notes.png", "tiff_labelled_png": "scan.tiff",
              "over_pixel_limit": "wide.png", "over_byte_limit": "big.png"}
MAX_BYTES = 200_000


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_file_gets_its_status_and_a_message_naming_it(tmp_path, case):
    body, status, needle = bad_requests(1, MAX_BYTES)[case]
    url = body["messages"][0]["content"][0]["image_url"]["url"]  # the one image, before the text
    f = tmp_path / FILE_CASES[case]
    f.write_bytes(base64.b64decode(url.partition(",")[2]))
    with pytest.raises(ImageInputError) as e:
        images.load(f, ImageLimits(max_bytes=MAX_BYTES))
    assert e.value.status == status
    assert str(e.value).startswith(f"{f}: ") and needle in str(e.value), str(e.value)
    if status == 415:
        assert "PNG" in str(e.value)  # lists what is supported


def test_truncated_jpeg_is_rejected(tmp_path):
    data = encode(picture(200, 200), "JPEG")
    f = tmp_path / "cut.jpg"
    f.write_bytes(data[: len(data) // 3])
    with pytest.raises(ImageInputError) as e:
        images.load(f, ImageLimits())
    assert e.value.status == 400 and "cut.jpg" in str(e.value)


def test_corrupt_png_body_is_a_400(tmp_path):
    data = bytearray(encode(picture(64, 64), "PNG"))
    mid = len(data) // 2
    data[mid:mid + 64] = b"\xff" * 64  # break the compressed stream, keep the header
    f = tmp_path / "bad.png"
    f.write_bytes(bytes(data))
    with pytest.raises(ImageInputError) as e:
        images.load(f, ImageLimits())
    assert e.value.status == 400 and "bad.png" in str(e.value)


def test_too_many_bytes_is_a_413_before_decoding(tmp_path):
    f = tmp_path / "big.png"
    f.write_bytes(encode(picture(), "PNG"))
    with pytest.raises(ImageInputError) as e:
        images.load(f, ImageLimits(max_bytes=100))
    assert e.value.status == 413 and "VLLM_EDGE_MAX_IMAGE_BYTES" in str(e.value)


def test_too_many_pixels_is_a_413(tmp_path):
    f = tmp_path / "wide.png"
    f.write_bytes(encode(picture(), "PNG"))
    with pytest.raises(ImageInputError) as e:
        images.load(f, ImageLimits(max_pixels=40 * 30 - 1))
    assert e.value.status == 413 and "40x30" in str(e.value)
    assert images.load(f, ImageLimits(max_pixels=40 * 30)).width == 40


def test_oversized_data_url_is_refused_before_base64_decoding():
    url = "data:image/png;base64," + "A" * 4000
    with pytest.raises(ImageInputError) as e:
        images.load(url, ImageLimits(max_bytes=1000))
    assert e.value.status == 413


def test_data_url_errors():
    png = encode(picture(), "PNG")
    with pytest.raises(ImageInputError, match="invalid base64") as e:
        images.load("data:image/png;base64,@@@notbase64@@@", ImageLimits())
    assert e.value.status == 400
    with pytest.raises(ImageInputError, match="image/tiff") as e:
        images.load(data_url(png, "image/tiff"), ImageLimits())
    assert e.value.status == 415
    with pytest.raises(ImageInputError, match="says JPEG but the data is PNG"):
        images.load(data_url(png, "image/jpeg"), ImageLimits())
    with pytest.raises(ImageInputError, match="not a base64 data URL"):
        images.load("data:image/png,rawbytes", ImageLimits())


def test_missing_file_and_remote_url(tmp_path):
    with pytest.raises(ImageInputError, match="no such image file"):
        images.load(tmp_path / "nope.png", ImageLimits())
    with pytest.raises(ImageInputError, match="remote image URLs are not fetched"):
        images.load("https://example.invalid/cat.png", ImageLimits())
    with pytest.raises(ImageInputError, match="not a regular file"):
        images.load(tmp_path, ImageLimits())


def test_count_limits():
    images.check_count(2, ImageLimits(max_images=2))
    with pytest.raises(ImageInputError, match="3 images in one prompt; the limit is 2") as e:
        images.check_count(3, ImageLimits(max_images=2))
    assert e.value.status == 400
    with pytest.raises(ImageInputError, match="takes no images"):
        images.check_count(1, ImageLimits(), model="smollm2", accepts_images=False)
    images.check_count(0, ImageLimits(), accepts_images=False)


def test_limits_from_env(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGES", "7")
    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGE_BYTES", "1234")
    lim = ImageLimits.from_env()
    assert (lim.max_images, lim.max_bytes) == (7, 1234)
    monkeypatch.setenv("VLLM_EDGE_MAX_IMAGE_PIXELS", "0")
    with pytest.raises(ValueError, match="VLLM_EDGE_MAX_IMAGE_PIXELS"):
        ImageLimits.from_env()


def test_openai_messages_for_a_server():
    png = encode(picture(), "PNG")
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
                {"type": "text", "text": "what is this?"}]}]
    (got,) = images.validate_openai_messages(msgs, ImageLimits())
    assert got.format == "PNG"
    two = [{"role": "user", "content": msgs[1]["content"] * 2}]
    with pytest.raises(ImageInputError, match="limit is 1") as e:
        images.validate_openai_messages(two, ImageLimits(max_images=1))
    assert e.value.param == "messages"
    path_url = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}]
    with pytest.raises(ImageInputError, match=r"^messages\[0\]\.content\[0\]: /etc/passwd: only data:image") as e:
        images.validate_openai_messages(path_url, ImageLimits())
    assert e.value.param == "messages[0].content[0]"
    bad = [{"role": "user", "content": [{"type": "image_url",
                                         "image_url": {"url": data_url(b"GIF89a-broken", "image/gif")}}]}]
    with pytest.raises(ImageInputError) as e:
        images.validate_openai_messages(bad, ImageLimits())
    assert e.value.status in (400, 415)
    # the part at fault is named: the second image of the second message
    late = [msgs[0], {"role": "user", "content": [msgs[1]["content"][0], bad[0]["content"][0]]}]
    with pytest.raises(ImageInputError, match=r"^messages\[1\]\.content\[1\]: data URL") as e:
        images.validate_openai_messages(late, ImageLimits())
    assert e.value.param == "messages[1].content[1]"
    with pytest.raises(ImageInputError, match="takes no images"):
        images.validate_openai_messages(msgs, ImageLimits(), accepts_images=False)


def test_to_data_url_round_trips(tmp_path):
    f = tmp_path / "x.jpg"
    f.write_bytes(encode(picture(), "JPEG"))
    url = images.to_data_url(f)
    assert url.startswith("data:image/jpeg;base64,")
    assert images.load(url, ImageLimits()).format == "JPEG"
