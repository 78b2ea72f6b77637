"""The import layers: common < core < engine adapters < benchmarks < report < CLI, and no
import cycle between modules.

Every import counts, function-local ones included: a local import still ties the two
modules together, it only hides the tie from a reader. Two rules the layers alone do not
state: the agent and the benchmarks share only the engine adapters, and no common or core
module names the CLI at all, not even as a string (a ``subprocess`` launch of
``python -m vllm_edge.cli`` ties the two as an import does).
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
    "bench": 3, "agent": 3,
    "cli": 5,
}
# Packages whose layer is not their top-level name's; the longest matching prefix wins.
SUBLAYERS = {
    "bench.engines": 2,  # engine adapters: measurement and the agent both import them
    "bench.report": 4,   # doc generation from the artifacts the measurements write
}
LAYER_NAMES = ("common", "core", "engine adapters", "benchmarks", "report", "CLI")
CORE = 1  # common and core: the layers that run inside vLLM and `serve`
CLI = "vllm_edge.cli"
AGENT = "vllm_edge.agent"
BENCH = "vllm_edge.bench"
ENGINES = "vllm_edge.bench.engines"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def under(module: str, package: str) -> bool:
    """``module`` is ``package`` or inside it (by dotted parts, not by string prefix)."""
    return module == package or module.startswith(package + ".")


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # the package itself: its __init__ holds only the version
        return 0
    for prefix in sorted(SUBLAYERS, key=len, reverse=True):
        if under(module, f"vllm_edge.{prefix}"):
            return SUBLAYERS[prefix]
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


def upward(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(module, imported module, line) for every import of a higher layer."""
    return [(name, target, line) for name, targets in sorted(edges.items())
            for target, line in sorted(targets.items()) if layer(target) > layer(name)]


def crossings(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(module, imported module, line) for every import between the agent and the benchmarks
    other than the agent's of the engine adapters: the agent imports nothing of bench but
    ``bench.engines``, and nothing under bench imports the agent."""
    bad = []
    for name, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            agent_into_bench = under(name, AGENT) and under(target, BENCH) and not under(target, ENGINES)
            bench_into_agent = under(name, BENCH) and under(target, AGENT)
            if agent_into_bench or bench_into_agent:
                bad.append((name, target, line))
    return bad


def cli_importers(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(module, imported module, line) for every import of the CLI from outside it."""
    return [(name, target, line) for name, targets in sorted(edges.items())
            for target, line in sorted(targets.items()) if under(target, CLI) and not under(name, CLI)]


def cli_mentions(sources: dict[str, str]) -> list[tuple[str, int]]:
    """(module, line) wherever a common or core module's source names the CLI package."""
    return [(name, n) for name, text in sorted(sources.items()) if layer(name) <= CORE
            for n, text_line in enumerate(text.splitlines(), 1) if CLI in text_line]


def _where(mods: dict[str, Path], found: list[tuple[str, str, int]]) -> list[str]:
    return [f"{mods[name].relative_to(SRC)}:{line}: {name} ({LAYER_NAMES[layer(name)]}) "
            f"imports {target} ({LAYER_NAMES[layer(target)]})" for name, target, line in found]


def test_no_upward_import():
    mods = modules()
    bad = _where(mods, upward(imports(mods)))
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    found = cycles(imports(modules()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_agent_and_the_benchmarks_share_only_the_engine_adapters():
    mods = modules()
    bad = _where(mods, crossings(imports(mods)))
    assert not bad, ("the agent may import bench.engines only, and nothing under bench imports "
                     "the agent:\n" + "\n".join(bad))


def test_only_the_cli_imports_the_cli():
    mods = modules()
    bad = _where(mods, cli_importers(imports(mods)))
    assert not bad, "imports of the CLI from outside it:\n" + "\n".join(bad)


def test_no_core_module_names_the_cli():
    """Not even in a string: ``[sys.executable, "-m", "vllm_edge.cli", ...]`` makes core
    depend on the CLI as surely as an import. Benchmarks may launch the CLI as a user does."""
    mods = modules()
    bad = [f"{mods[name].relative_to(SRC)}:{line}: {name} ({LAYER_NAMES[layer(name)]}) names {CLI}"
           for name, line in cli_mentions({name: path.read_text() for name, path in mods.items()})]
    assert not bad, "common and core modules that name the CLI:\n" + "\n".join(bad)


def test_checks_can_fail():
    """The detectors find what they are for, on a made-up graph."""
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert layer("vllm_edge.runtime.engine") < layer("vllm_edge.bench.speed") < layer("vllm_edge.cli")
    assert layer("vllm_edge.common.atomic") == layer("vllm_edge.envs") == 0
    assert (layer("vllm_edge.runtime.engine") < layer("vllm_edge.bench.engines.llamacpp")
            < layer("vllm_edge.bench.speed") == layer("vllm_edge.bench") == layer("vllm_edge.agent.loop")
            < layer("vllm_edge.bench.report.claims") == layer("vllm_edge.bench.report")
            < layer("vllm_edge.cli.report"))
    assert layer("vllm_edge.bench.engines_extra") == layer("vllm_edge.bench.speed")  # parts, not text

    graph = {
        "vllm_edge.bench.speed": {"vllm_edge.bench.report.results": 1, "vllm_edge.bench.engines.llamacpp": 2},
        "vllm_edge.bench.engines.llamacpp": {"vllm_edge.bench.speed": 3, "vllm_edge.models.store": 4},
        "vllm_edge.bench.report.claims": {"vllm_edge.bench.speed": 5, "vllm_edge.agent.suite": 6},
        "vllm_edge.agent.loop": {"vllm_edge.bench.engines.chat": 7, "vllm_edge.bench.soak": 8,
                                 "vllm_edge.bench": 9},
        "vllm_edge.bench.constrained": {"vllm_edge.agent.tools": 10, "vllm_edge.common.phone_tools": 11},
        "vllm_edge.models.store": {"vllm_edge.cli.serve": 12},
        "vllm_edge.cli.report": {"vllm_edge.cli.args": 13, "vllm_edge.bench.report.results": 14},
    }
    assert [(a, b) for a, b, _ in upward(graph)] == [
        ("vllm_edge.bench.engines.llamacpp", "vllm_edge.bench.speed"),
        ("vllm_edge.bench.speed", "vllm_edge.bench.report.results"),
        ("vllm_edge.models.store", "vllm_edge.cli.serve")]
    assert [(a, b) for a, b, _ in crossings(graph)] == [
        ("vllm_edge.agent.loop", "vllm_edge.bench"), ("vllm_edge.agent.loop", "vllm_edge.bench.soak"),
        ("vllm_edge.bench.constrained", "vllm_edge.agent.tools"),
        ("vllm_edge.bench.report.claims", "vllm_edge.agent.suite")]
    assert [(a, b) for a, b, _ in cli_importers(graph)] == [("vllm_edge.models.store", "vllm_edge.cli.serve")]

    launch = 'import sys\ncmd = [sys.executable, "-m", "vllm_edge.cli", "serve"]\n'
    assert cli_mentions({"vllm_edge.serving.keepalive": launch, "vllm_edge.common.atomic": "x = 1\n",
                         "vllm_edge.bench.soak": launch, "vllm_edge.cli.serve": launch}) == [
        ("vllm_edge.serving.keepalive", 2)]


def test_every_top_level_name_has_a_layer():
    for path in PACKAGE.iterdir():
        if path.name.startswith(("_", ".")) or path.name.endswith(".egg-info"):
            continue
        name = path.stem if path.suffix == ".py" else path.name
        if path.is_dir() and not any(path.glob("*.py")) and name != "data":
            continue
        assert name in LAYERS, f"{path}: not in LAYERS"
    for prefix in SUBLAYERS:  # a renamed package would silently fall back to its parent's layer
        assert (PACKAGE / prefix.replace(".", "/") / "__init__.py").is_file(), f"{prefix}: no such package"
