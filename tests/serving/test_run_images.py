"""`vllm-edge run --image` with bad inputs: a clear message and exit 2, before any engine
starts (each case returns in the time of an import, not of an engine start). The text-only
model case, which resolves the default model, is in test_run_images_engine."""

from __future__ import annotations

from PIL import Image

from support.cli_runner import run_refused
from support.image_samples import solid_png


def test_truncated_image(tmp_path):
    f = tmp_path / "cut.png"
    f.write_bytes(solid_png(300, 300)[:200])
    err = run_refused("--image", str(f))
    assert "cut.png" in err and "truncated" in err


def test_corrupt_image(tmp_path):
    data = bytearray(solid_png(128, 128))
    data[60:120] = b"\x00" * 60
    f = tmp_path / "bad.png"
    f.write_bytes(bytes(data))
    err = run_refused("--image", str(f))
    assert "error:" in err and "bad.png" in err


def test_text_file_named_solid_png(tmp_path):
    f = tmp_path / "readme.png"
    f.write_text("not an image at all\n")
    err = run_refused("--image", str(f))
    assert "readme.png" in err and "not a recognisable image" in err


def test_unsupported_format(tmp_path):
    f = tmp_path / "scan.tif"
    Image.new("RGB", (32, 32)).save(f, format="TIFF")
    err = run_refused("--image", str(f))
    assert "format TIFF is not supported" in err


def test_image_over_the_byte_limit(tmp_path):
    f = tmp_path / "big.png"
    f.write_bytes(solid_png())
    err = run_refused("--image", str(f), env={"VLLM_EDGE_MAX_IMAGE_BYTES": "64"})
    assert "big.png" in err and "VLLM_EDGE_MAX_IMAGE_BYTES" in err


def test_image_over_the_pixel_limit(tmp_path):
    f = tmp_path / "wide.png"
    f.write_bytes(solid_png(64, 48))
    err = run_refused("--image", str(f), env={"VLLM_EDGE_MAX_IMAGE_PIXELS": "1000"})
    assert "64x48" in err and "VLLM_EDGE_MAX_IMAGE_PIXELS" in err


def test_more_images_than_allowed(tmp_path):
    f = tmp_path / "ok.png"
    f.write_bytes(solid_png())
    err = run_refused("--image", str(f), "--image", str(f), env={"VLLM_EDGE_MAX_IMAGES": "1"})
    assert "2 images in one prompt; the limit is 1" in err
