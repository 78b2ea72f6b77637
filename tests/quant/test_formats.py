"""The weight-format registry: every format module is found, declares what the rest of the
project asks of it, and is what the CLI, the quantizer and the store offer."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from vllm_edge.quant import formats


def test_every_module_of_the_package_is_a_registered_format():
    mods = [m.name for m in pkgutil.iter_modules(formats.__path__) if not m.name.startswith("_")]
    assert sorted(mods) == sorted(formats.names())
    for name in mods:
        fmt = importlib.import_module(f"vllm_edge.quant.formats.{name}").FORMAT
        assert fmt.name == name and fmt is formats.get(name)
        assert fmt.default_group in fmt.groups and fmt.bits > 0 and fmt.summary
        assert callable(fmt.encoder())
        assert fmt.config(fmt.default_group)["quant_method"] == name


def test_the_cli_offers_the_registry():
    from vllm_edge.cli.args import QUANT_SCHEMES

    assert QUANT_SCHEMES == formats.names() and formats.DEFAULT in QUANT_SCHEMES


def test_an_unknown_format_is_named_with_the_list():
    with pytest.raises(formats.UnknownFormat, match=r"'int3' is not implemented; available: cpu_int4, cpu_int8, gptq"):
        formats.get("int3")


def test_lossless_sources_are_found_by_type():
    assert formats.taking("gptq").name == formats.DEFAULT
    assert formats.taking("AWQ").name == formats.DEFAULT
    assert formats.taking("gguf:Q4_K").name == formats.DEFAULT
    assert formats.taking("gguf:Q2_K") is None and formats.taking("fp8") is None


def test_each_format_encodes_a_weight_it_decodes_close_to():
    import torch

    torch.manual_seed(0)
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    for fmt in formats.all_formats():
        tensors, deq = fmt.encoder()(w, fmt.default_group)
        assert tensors and deq.shape == w.shape
        rel = ((deq.float() - w.float()).norm() / w.float().norm()).item()
        assert rel < 0.2, (fmt.name, rel)


def test_the_plugin_registers_each_format_vllm_lacks():
    from vllm_edge import quant

    regs = quant.register()
    assert [r.name for r in regs] == [f.name for f in formats.with_vllm_config()]
    assert all(r.state == "registered" for r in regs)


def test_the_docs_table_has_one_row_per_format():
    rows = formats.table()
    assert [r["format"] for r in rows] == list(formats.names())
    assert "gguf:Q4_K" in rows[0]["kept losslessly"]


def test_a_format_name_is_written_in_its_module_and_the_registry_only():
    """A format of our own (one the plugin registers with vLLM) has its name as a literal only
    where it is declared (its module) and where the registry names its default; every other
    module asks the registry. (A name vLLM also uses for others' checkpoints, such as "gptq",
    is a checkpoint's quant_method too, and is read as such where folders are inspected.)"""
    import re
    from pathlib import Path

    src = Path(formats.__file__).resolve().parents[3]
    for name in [f.name for f in formats.with_vllm_config()]:
        literal = re.compile(rf"""["']{re.escape(name)}["']""")
        holders = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if literal.search(p.read_text()))
        allowed = {f"vllm_edge/quant/formats/{name}.py", "vllm_edge/quant/formats/__init__.py"}
        assert set(holders) <= allowed, (name, holders)
