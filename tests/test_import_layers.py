"""The import layers: common < core < benchmarks < CLI, and no import cycle between modules.

Every import counts, function-local ones included: a local import still ties the two
modules together, it only hides the tie from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "vllm_edge"

# Layer of each top-level name under vllm_edge; a module may import its own layer or below.
LAYERS = {
    "common": 0, "envs": 0, "data": 0,
    "plugin": 1, "patches": 1, "quant": 1, "kernels": 1, "attention": 1, "runtime": 1, "models": 1,
    "serving": 1, "doctor": 1,
    "bench": 2, "agent": 2,
    "cli": 3,
}
LAYER_NAMES = ("common", "core", "benchmarks", "CLI")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # the package itself: its __init__ holds only the version
        return 0
    try:
        return LAYERS[parts[1]]
    except KeyError:
        pytest.fail(f"{module}: no layer assigned; add {parts[1]!r} to LAYERS in {__file__}")


def imports(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported vllm_edge module: line}. ``from pkg import name`` counts as an
    import of ``pkg.name`` when that is a module, else of ``pkg``."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        out: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}:{node.lineno}: use absolute imports"
                if node.module and node.module.split(".")[0] == "vllm_edge":
                    for alias in node.names:
                        full = f"{node.module}.{alias.name}"
                        targets.append(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "vllm_edge"]
            for target in targets:
                if target != name:
                    out.setdefault(target, node.lineno)
        edges[name] = out
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_upward_import():
    mods = modules()
    bad = []
    for name, targets in sorted(imports(mods).items()):
        for target, line in sorted(targets.items()):
            if layer(target) > layer(name):
                bad.append(f"{mods[name].relative_to(SRC)}:{line}: {name} ({LAYER_NAMES[layer(name)]}) "
                           f"imports {target} ({LAYER_NAMES[layer(target)]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    found = cycles(imports(modules()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_checks_can_fail():
    """The detectors find what they are for, on a made-up graph."""
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert layer("vllm_edge.runtime.engine") < layer("vllm_edge.bench.speed") < layer("vllm_edge.cli")
    assert layer("vllm_edge.common.atomic") == layer("vllm_edge.envs") == 0


def test_every_top_level_name_has_a_layer():
    for path in PACKAGE.iterdir():
        if path.name.startswith(("_", ".")) or path.name.endswith(".egg-info"):
            continue
        name = path.stem if path.suffix == ".py" else path.name
        if path.is_dir() and not any(path.glob("*.py")) and name != "data":
            continue
        assert name in LAYERS, f"{path}: not in LAYERS"
