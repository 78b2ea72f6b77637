"""The test layout: slow tests (they start vLLM or llama.cpp) live in modules named
``*_engine.py``, and every test of such a module is slow, so ``-m "not slow"`` and the file
names agree. Read with ast, never imported.

A test is slow when its module sets ``pytestmark = pytest.mark.slow`` (alone or in a list), or
it, or its class, carries ``@pytest.mark.slow``, or one of its ``pytest.param(...)`` cases is
marked slow (that module then holds a slow test too).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# test_<what>_engine.py; runtime/test_engine.py tests runtime/engine.py and is not one
ENGINE_MODULE = re.compile(r"test_.+_engine\.py")


def _is_slow_mark(node: ast.AST) -> bool:
    """``pytest.mark.slow`` or ``mark.slow`` (also called, ``pytest.mark.slow(...)``)."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Attribute) and node.attr == "slow"
            and isinstance(node.value, ast.Attribute) and node.value.attr == "mark")


def _marks(value: ast.AST) -> list[ast.AST]:
    return list(value.elts) if isinstance(value, (ast.List, ast.Tuple)) else [value]


def _module_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            return any(_is_slow_mark(m) for m in _marks(node.value))
    return False


def _has_slow_param(fn: ast.AST) -> bool:
    """A ``pytest.param(..., marks=pytest.mark.slow)`` anywhere in the test's decorators."""
    for dec in getattr(fn, "decorator_list", []):
        for call in ast.walk(dec):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "param"):
                continue
            if any(k.arg == "marks" and any(map(_is_slow_mark, _marks(k.value))) for k in call.keywords):
                return True
    return False


def classify(source: str) -> dict[str, str]:
    """Each test in ``source`` -> "slow", "fast" or "mixed" (some parameter cases slow)."""
    tree = ast.parse(source)
    module_slow = _module_slow(tree)
    out = {}

    def visit(body, prefix: str, inherited: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                slow = inherited or any(_is_slow_mark(d) for d in node.decorator_list)
                visit(node.body, f"{prefix}{node.name}::", slow)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if inherited or any(_is_slow_mark(d) for d in node.decorator_list):
                    out[prefix + node.name] = "slow"
                else:
                    out[prefix + node.name] = "mixed" if _has_slow_param(node) else "fast"

    visit(tree.body, "", module_slow)
    return out


def layout_problems(name: str, source: str) -> list[str]:
    """What is wrong with a test module called ``name`` holding ``source`` (empty: nothing)."""
    tests = classify(source)
    if ENGINE_MODULE.fullmatch(Path(name).name):
        return [f"{name}::{t} is not marked slow, but *_engine.py modules hold only slow tests"
                for t, kind in tests.items() if kind != "slow"]
    return [f"{name}::{t} is {'partly ' if kind == 'mixed' else ''}slow: move it to a *_engine.py module"
            for t, kind in tests.items() if kind != "fast"]


def _test_modules():
    return sorted(TESTS.rglob("test_*.py"))


def test_every_slow_test_lives_in_an_engine_module_and_only_there():
    modules = _test_modules()
    assert len(modules) > 50 and any(m.name.endswith("_engine.py") for m in modules)
    problems = [p for m in modules for p in layout_problems(str(m.relative_to(TESTS)), m.read_text())]
    assert not problems, "\n".join(problems)


FAST_WITH_A_SLOW_TEST = '''
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_engine():
    pass
'''


@pytest.mark.parametrize("source,expected", [
    (FAST_WITH_A_SLOW_TEST, {"test_quick": "fast", "test_engine": "slow"}),
    ("import pytest\npytestmark = pytest.mark.slow\ndef test_a(): pass\n", {"test_a": "slow"}),
    ("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('x')]\n"
     "class TestX:\n    def test_a(self): pass\n", {"TestX::test_a": "slow"}),
    ("import pytest\n@pytest.mark.slow\nclass TestX:\n    def test_a(self): pass\n",
     {"TestX::test_a": "slow"}),
    ("import pytest\n@pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.slow)])\n"
     "def test_a(x): pass\n", {"test_a": "mixed"}),
    ("import pytest\npytestmark = pytest.mark.filterwarnings('x')\ndef test_a(): pass\n"
     "def helper(): pass\n", {"test_a": "fast"}),
])
def test_classify(source, expected):
    assert classify(textwrap.dedent(source)) == expected


def test_a_slow_test_in_a_fast_module_is_caught():
    assert layout_problems("bench/test_speed.py", FAST_WITH_A_SLOW_TEST) == [
        "bench/test_speed.py::test_engine is slow: move it to a *_engine.py module"]
    # test_engine.py tests a module named engine: a fast module like any other
    assert layout_problems("runtime/test_engine.py", FAST_WITH_A_SLOW_TEST) == [
        "runtime/test_engine.py::test_engine is slow: move it to a *_engine.py module"]


def test_a_fast_test_in_an_engine_module_is_caught():
    assert layout_problems("bench/test_speed_engine.py", FAST_WITH_A_SLOW_TEST) == [
        "bench/test_speed_engine.py::test_quick is not marked slow, "
        "but *_engine.py modules hold only slow tests"]
    assert layout_problems("test_x_engine.py", "import pytest\npytestmark = pytest.mark.slow\n"
                                                "def test_a(): pass\n") == []
