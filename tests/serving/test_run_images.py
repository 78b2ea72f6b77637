"""`vllm-edge run --image` with bad inputs: a clear message and exit 2, before any engine
starts (each case returns in the time of an import, not of an engine start)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from support.cli_runner import run_cli


def png(w: int = 64, h: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, format="PNG")
    return buf.getvalue()


def fails(*args: str, env: dict | None = None) -> str:
    proc = run_cli("run", *args, env=env, timeout=600)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert "engine ready" not in proc.stderr and "Initializing" not in proc.stdout + proc.stderr
    return proc.stderr


def test_truncated_image(tmp_path):
    f = tmp_path / "cut.png"
    f.write_bytes(png(300, 300)[:200])
    err = fails("--image", str(f))
    assert "cut.png" in err and "truncated" in err


def test_corrupt_image(tmp_path):
    data = bytearray(png(128, 128))
    data[60:120] = b"\x00" * 60
    f = tmp_path / "bad.png"
    f.write_bytes(bytes(data))
    err = fails("--image", str(f))
    assert "error:" in err and "bad.png" in err


def test_text_file_named_png(tmp_path):
    f = tmp_path / "readme.png"
    f.write_text("not an image at all\n")
    err = fails("--image", str(f))
    assert "readme.png" in err and "not a recognisable image" in err


def test_unsupported_format(tmp_path):
    f = tmp_path / "scan.tif"
    Image.new("RGB", (32, 32)).save(f, format="TIFF")
    err = fails("--image", str(f))
    assert "format TIFF is not supported" in err


def test_image_over_the_byte_limit(tmp_path):
    f = tmp_path / "big.png"
    f.write_bytes(png())
    err = fails("--image", str(f), env={"VLLM_EDGE_MAX_IMAGE_BYTES": "64"})
    assert "big.png" in err and "VLLM_EDGE_MAX_IMAGE_BYTES" in err


def test_image_over_the_pixel_limit(tmp_path):
    f = tmp_path / "wide.png"
    f.write_bytes(png(64, 48))
    err = fails("--image", str(f), env={"VLLM_EDGE_MAX_IMAGE_PIXELS": "1000"})
    assert "64x48" in err and "VLLM_EDGE_MAX_IMAGE_PIXELS" in err


def test_more_images_than_allowed(tmp_path):
    f = tmp_path / "ok.png"
    f.write_bytes(png())
    err = fails("--image", str(f), "--image", str(f), env={"VLLM_EDGE_MAX_IMAGES": "1"})
    assert "2 images in one prompt; the limit is 1" in err


@pytest.mark.slow  # resolves (and on first use converts) the default text model
def test_image_on_a_text_only_model(tmp_path, default_model_dir):
    f = tmp_path / "ok.png"
    f.write_bytes(png())
    err = fails("--model", str(default_model_dir), "--image", str(f))
    assert "takes no images" in err
