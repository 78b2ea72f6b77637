"""`vllm-edge compare` (skeleton) builds a grid spec the grid accepts; nothing is run."""

from __future__ import annotations

from pathlib import Path

from vllm_edge.harness import compare, grid


def test_spec_pairs_matched_builds_on_the_same_threads():
    paths = {"vllm-bf16": Path("/m/bf16"), "vllm-cpu_int4": Path("/m/int4"),
             "llamacpp-BF16": Path("/g/m.bf16.gguf"), "llamacpp-Q4_K_M": Path("/g/m.bf16.Q4_K_M.gguf")}
    spec = grid.load_spec(compare.build_spec(paths, threads=2, cores=[0, 1]))
    names = [a.name for a in spec["arms"]]
    assert names == list(paths)
    for arm in spec["arms"]:
        i = arm.cmd.index("--threads")
        assert arm.cmd[i + 1] == "2"
        assert ("llamacpp_arm" in " ".join(arm.cmd)) == arm.name.startswith("llamacpp-")
    assert ["vllm-cpu_int4", "llamacpp-Q4_K_M"] in spec["pairs"]
    assert spec["cores"] == [0, 1]


def test_builds_derive_from_one_bf16_directory():
    b = compare.builds("default")
    assert b["llamacpp-Q4_0"].name == "smollm2-135m.bf16.Q4_0.gguf"
    assert b["llamacpp-BF16"].parent == b["llamacpp-Q8_0"].parent
