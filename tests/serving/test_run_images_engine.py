"""`vllm-edge run --image` on a text-only model: refused with a clear message before any engine
starts (slow: it resolves, and on first use converts, the default text model)."""

from __future__ import annotations

import pytest

from support.cli_runner import run_refused
from support.image_samples import solid_png

pytestmark = pytest.mark.slow


def test_image_on_a_text_only_model(tmp_path, default_model_dir):
    f = tmp_path / "ok.png"
    f.write_bytes(solid_png())
    err = run_refused("--model", str(default_model_dir), "--image", str(f))
    assert "takes no images" in err
