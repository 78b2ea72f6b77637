"""`bench constrained --engine llamacpp` on a real GGUF (the embedded SmolLM2-135M Q4_1): the
same requests as on a server, every constrained answer valid, each grammar build timed, and
the artifact renders in the serve guide's table."""

from __future__ import annotations

import json

import pytest

from support.llamacpp import default_gguf, need_llama_cpp

pytestmark = pytest.mark.slow


def test_the_llamacpp_arm_writes_a_valid_artifact(tmp_path, capsys):
    need_llama_cpp()
    from vllm_edge.bench.report import guide_tables
    from vllm_edge.cli import main

    out = tmp_path / "constrained" / "llamacpp.json"
    assert main(["bench", "constrained", "--engine", "llamacpp", "--gguf", str(default_gguf()),
                 "--chat-template", "src/vllm_edge/data/smollm2_tools.jinja",
                 "--schemas", "1", "--repeats", "1", "--out", str(out)]) == 0
    art = json.loads(out.read_text())
    assert art["engine"] == "llamacpp" and art["provenance"]["versions"]
    assert art["config"]["gguf_sha256"] and art["config"]["chat_template"].endswith("smollm2_tools.jinja")
    rows = art["rows"]
    assert [(r["mode"], r["kind"]) for r in rows] == [
        ("json_schema", "first"), ("json_schema", "warm"), ("json_schema", "free"),
        ("tool_required", "cold"), ("tool_required", "warm"), ("tool_required", "free")]
    for r in rows:
        if r["kind"] != "free":
            assert r["verdict"] in ("valid", "length"), r
            assert r["grammar_s"] > 0 and r["ttft_s"] >= r["grammar_s"]
    # no grammar for the free JSON twin; vLLM's `auto` still holds an opened call to the format
    free = {r["mode"]: r for r in rows if r["kind"] == "free"}
    assert free["json_schema"]["grammar_s"] is None and free["tool_required"]["grammar_s"] > 0
    table = guide_tables.render_constrained(tmp_path, tmp_path / "serve.md")
    assert f"| llamacpp | {default_gguf().name} | `tool_required` |" in table
