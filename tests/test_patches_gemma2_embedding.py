"""gemma2_embedding_quant without an engine: on the pinned vLLM it applies (Gemma2Model builds its
embedding without the config); the replacement hands the config and prefix to the embedding built
inside the model's own __init__ only, and puts the module's name back whatever happens. The real
engine runs a Gemma 2 repack's embedding and tied head quantized in
tests/models/test_gguf_families_engine.py."""

from __future__ import annotations

import sys
import textwrap

import pytest

from vllm_edge import patches
from vllm_edge.patches import gemma2_embedding_quant as g2

MODEL = '''
def VocabParallelEmbedding(vocab, hidden, quant_config=None, prefix=""):
    return ("table", vocab, hidden, quant_config, prefix)


def Other(*args, **kwargs):
    return ("other", kwargs.get("quant_config"))


def compile_wrapper(cls):  # as vLLM's support_torch_compile: the model's __init__ in a closure
    old_init = cls.__init__

    def __init__(self, *, vllm_config=None, prefix="", **kwargs):
        old_init(self, vllm_config=vllm_config, prefix=prefix, **kwargs)

    cls.__init__ = __init__
    return cls


@compile_wrapper
class Model:
    def __init__(self, *, vllm_config, prefix=""):
        self.embed_tokens = VocabParallelEmbedding(
            10,
            4,{fixed}
        )
        self.other = Other(quant_config=None)
        if vllm_config.fail:
            raise RuntimeError("failed in the model")
'''


class Config:
    def __init__(self, quant_config, fail=False):
        self.quant_config, self.fail = quant_config, fail


def _module(tmp_path, monkeypatch, fixed=""):
    (tmp_path / "fake_gemma2.py").write_text(textwrap.dedent(MODEL).replace("{fixed}", fixed))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_gemma2", None)
    import fake_gemma2

    monkeypatch.setitem(sys.modules, "fake_gemma2", fake_gemma2)
    return fake_gemma2


def test_the_pinned_vllm_builds_gemma2s_embedding_without_the_config():
    patches.load_all()
    p = g2.PATCH
    assert p.state is patches.State.APPLIED, p.detail
    from vllm.model_executor.models import gemma2

    assert getattr(gemma2.Gemma2Model.__init__, "__vllm_edge_patch__", None) == p.name
    assert not g2._is_fixed_upstream(gemma2.Gemma2Model, "__init__", p.original)


def test_the_embedding_gets_the_config_and_prefix_and_nothing_else_does(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch)
    original, build = mod.Model.__init__, mod.VocabParallelEmbedding
    new = g2._make_replacement(mod.Model, "__init__", original)
    monkeypatch.setattr(mod.Model, "__init__", new)
    qc = object()
    m = mod.Model(vllm_config=Config(qc), prefix="model")
    assert m.embed_tokens == ("table", 10, 4, qc, "model.embed_tokens")
    assert m.other == ("other", None)
    assert mod.VocabParallelEmbedding is build  # rebound for the construction only
    plain = mod.Model(vllm_config=Config(None), prefix="model")  # no quantization: the original
    assert plain.embed_tokens == ("table", 10, 4, None, "")
    with pytest.raises(RuntimeError, match="failed in the model"):
        mod.Model(vllm_config=Config(qc, fail=True))
    assert mod.VocabParallelEmbedding is build


def test_a_model_that_passes_the_config_itself_is_fixed_upstream(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, fixed="\n            quant_config=vllm_config.quant_config,")
    assert g2._is_fixed_upstream(mod.Model, "__init__", mod.Model.__init__)
    (tmp_path / "stock").mkdir()
    stock = _module(tmp_path / "stock", monkeypatch)
    assert not g2._is_fixed_upstream(stock.Model, "__init__", stock.Model.__init__)


def test_a_model_that_no_longer_builds_the_table_itself_is_a_missing_target(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch)

    class Elsewhere:
        def __init__(self, *, vllm_config, prefix=""):
            self.embed_tokens = None

    Elsewhere.__module__ = mod.__name__
    with pytest.raises(LookupError, match="no longer calls VocabParallelEmbedding"):
        g2._make_replacement(Elsewhere, "__init__", Elsewhere.__init__)
