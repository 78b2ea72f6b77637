"""models.gguf_pretokenizer: the tokenizer a GGUF import saves splits text as llama.cpp does for
the file's tokenizer.ggml.pre, checked against llama.cpp's own tokenizer on files that differ
from the shipped one only in that name and their architecture (needs llama-cpp-python)."""

from __future__ import annotations

import logging

import gguf
import pytest

from support.llamacpp import default_gguf, need_llama_cpp
from vllm_edge.models import gguf_import

# digit runs (smollm: one a token), blank lines and runs of spaces (qwen2 groups newlines),
# contractions, tabs, carriage returns and non-ASCII
TEXTS = ("x = 12345 + 678\n\n\n    indented   spaces\tand tabs\n",
         "It's 2024; they'll say \"don't\"!\r\n\r\nOK",
         "naïve café — 3.14159, 1,000,000 users\n  - item\n\n\tdone")


def _vocab_file(src, dst, *, pre: str, arch: str = "llama"):
    """``src``'s metadata (its tokenizer) as ``arch``'s, with tokenizer.ggml.pre set to ``pre``, no tensors."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", "tokenizer.ggml.pre"):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k.replace("llama.", f"{arch}.", 1) if k.startswith("llama.") else k, f.contents(),
                        f.types[0], sub_type=sub)
    w.add_tokenizer_pre(pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _saved(tok, where, model_type: str):
    """The tokenizer as a build holds it: saved beside a config of the model's type, then loaded
    as vLLM loads it (transformers picks the class from both)."""
    import json

    from transformers import AutoTokenizer

    tok.save_pretrained(str(where))
    (where / "config.json").write_text(json.dumps({"model_type": model_type}))
    return AutoTokenizer.from_pretrained(str(where))


def _llama_cpp(path):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        return [list(llm.tokenize(t.encode(), add_bos=False, special=True)) for t in TEXTS]
    finally:
        llm.close()


@pytest.mark.parametrize("pre,arch", [("gpt-2", "qwen3"), ("smollm", "llama"), ("qwen2", "qwen2"),
                                      ("qwen2", "llama"), ("gpt-2", "llama"), ("gpt-2", "phi3")])
def test_the_saved_tokenizer_splits_as_llama_cpp_for_the_files_name(tmp_path, pre, arch):
    need_llama_cpp()
    f = _vocab_file(default_gguf(), tmp_path / "v.gguf", pre=pre, arch=arch)
    tok = _saved(gguf_import.read_tokenizer(f, gguf_import.inspect_gguf(f)), tmp_path / "tok", arch)
    ours = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    assert ours == _llama_cpp(f)


def test_a_qwen2_file_naming_another_split_is_warned_about(tmp_path, caplog):
    """transformers loads any qwen2 model's tokenizer as Qwen2Tokenizer: the import cannot give
    it GPT-2's split, and says so; the loaded tokenizer does leave llama.cpp's ids."""
    need_llama_cpp()
    f = _vocab_file(default_gguf(), tmp_path / "v.gguf", pre="gpt-2", arch="qwen2")
    with caplog.at_level(logging.WARNING, logger="vllm_edge.models"):
        tok = gguf_import.read_tokenizer(f, gguf_import.inspect_gguf(f))
    assert "names the pre-tokenizer 'gpt-2', but transformers loads every qwen2 model's" in caplog.text
    tok = _saved(tok, tmp_path / "tok", "qwen2")
    assert [tok.encode(t, add_special_tokens=False) for t in TEXTS] != _llama_cpp(f)


def test_the_names_split_differently_so_the_check_can_fail(tmp_path):
    """llama.cpp splits these texts one way under GPT-2's name and another under Qwen2's (on
    this vocabulary, which holds no token of two digits, smollm's single digits change nothing),
    and the architecture's own class (what transformers saves without the mapping) leaves
    llama.cpp on a qwen3 file that names GPT-2's split."""
    need_llama_cpp()
    got = {pre: _llama_cpp(_vocab_file(default_gguf(), tmp_path / f"{pre}.gguf", pre=pre))
           for pre in ("gpt-2", "qwen2")}
    assert got["gpt-2"] != got["qwen2"]
    from transformers import AutoTokenizer

    f = _vocab_file(default_gguf(), tmp_path / "q.gguf", pre="gpt-2", arch="qwen3")
    plain = _saved(AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="q.gguf"), tmp_path / "plain", "qwen3")
    assert [plain.encode(t, add_special_tokens=False) for t in TEXTS] != _llama_cpp(f)


def test_an_unmapped_name_keeps_transformers_reading_and_says_so(tmp_path, caplog):
    f = _vocab_file(default_gguf(), tmp_path / "v.gguf", pre="llama-bpe")
    with caplog.at_level(logging.WARNING, logger="vllm_edge.models"):
        tok = gguf_import.read_tokenizer(f, gguf_import.inspect_gguf(f))
    assert "pre-tokenizer 'llama-bpe' (tokenizer.ggml.pre) is not one we map" in caplog.text
    assert str(f) in caplog.text and type(tok).__name__ != "Qwen2Tokenizer"
