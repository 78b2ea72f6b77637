"""The env inventory: every name read in src/ is declared, and docs/reference/configuration.md is
exactly what envs.markdown() renders from the declarations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vllm_edge import envs

SRC = Path(__file__).resolve().parents[1] / "src" / "vllm_edge"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "configuration.md"
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]+$")


def _literal_env_names(tree: ast.AST) -> set[str]:
    """Names used with os.environ[...], os.environ.get/pop/setdefault, os.getenv, `in os.environ`,
    and envs.get/is_set."""
    found: set[str] = set()

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.add(node.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            via_os = (is_environ(f.value) and f.attr in ("get", "pop", "setdefault")) or f.attr == "getenv"
            via_envs = isinstance(f.value, ast.Name) and f.value.id == "envs" and f.attr in ("get", "is_set")
            if (via_os or via_envs) and node.args and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                found.add(node.left.value)
    return found


def _env_keyword_names(tree: ast.AST) -> set[str]:
    """Names set for child processes: dict(os.environ, NAME=...) and env["NAME"] = ..."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            if node.args and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "environ":
                found.update(k.arg for k in node.keywords if k.arg and ENV_NAME.match(k.arg))
    return found


def all_env_accesses() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _literal_env_names(tree) | _env_keyword_names(tree):
            where.setdefault(name, []).append(str(path.relative_to(SRC)))
    return where


def test_scanner_finds_known_accesses():
    # The scan must be able to fail: it sees the reads we know exist.
    names = all_env_accesses()
    assert "VLLM_EDGE_LOG_LEVEL" in names
    assert "VLLM_CACHE_ROOT" in names


def test_scanner_catches_an_undeclared_read():
    tree = ast.parse("import os\nx = os.environ.get('SOME_UNDECLARED_THING')\ny = os.getenv('OTHER_ONE')\n")
    assert _literal_env_names(tree) == {"SOME_UNDECLARED_THING", "OTHER_ONE"}


def test_every_env_access_in_src_is_declared():
    undeclared = {n: w for n, w in all_env_accesses().items() if n not in envs.DECLARED}
    assert not undeclared, f"undeclared environment variables (declare them in envs.py): {undeclared}"


def test_every_declared_name_is_documented():
    text = DOCS.read_text()
    missing = [n for n in envs.DECLARED if f"`{n}`" not in text]
    assert not missing, f"docs/reference/configuration.md does not document: {missing}"


def test_configuration_doc_is_generated():
    assert DOCS.read_text() == envs.markdown(), (
        "docs/reference/configuration.md differs from envs.py's declarations; regenerate it: "
        "PYTHONPATH=src python -m vllm_edge.envs > docs/reference/configuration.md")


def test_generated_doc_follows_a_changed_declaration(monkeypatch):
    # The comparison can fail: a changed meaning changes the rendered page.
    var = envs.DECLARED["VLLM_EDGE_LOG_LEVEL"]
    monkeypatch.setitem(envs.DECLARED, var.name, envs.EnvVar(var.name, var.type, var.default,
                                                             "tampered meaning", var.evidence))
    assert envs.markdown() != DOCS.read_text()
    assert "tampered meaning" in envs.markdown()


def test_declarations_are_complete():
    for var in envs.DECLARED.values():
        assert var.meaning and var.evidence, var.name
        assert var.type in {"bool", "int", "str", "path", "json"}, var.name
        if var.owner == "vllm-edge":
            assert var.name.startswith("VLLM_EDGE_"), var.name


def test_typed_values(monkeypatch):
    monkeypatch.setenv("VLLM_EDGE_PATCH_AOT_CACHE", "off")
    assert envs.get("VLLM_EDGE_PATCH_AOT_CACHE") is False
    monkeypatch.setenv("VLLM_EDGE_PATCH_AOT_CACHE", "maybe")
    with pytest.raises(ValueError, match="VLLM_EDGE_PATCH_AOT_CACHE"):
        envs.get("VLLM_EDGE_PATCH_AOT_CACHE")
    monkeypatch.setenv("VLLM_EDGE_HOME", "~/x")
    assert envs.home() == Path("~/x").expanduser()
    with pytest.raises(KeyError):
        envs.get("VLLM_EDGE_NOT_DECLARED")


@pytest.mark.parametrize("name, value, message", [
    ("VLLM_EDGE_THREADS", "two", "VLLM_EDGE_THREADS='two': expected an integer"),
    ("VLLM_EDGE_THREADS", "0", "VLLM_EDGE_THREADS='0': must be at least 1"),
    ("VLLM_EDGE_MAX_IMAGES", "-3", "VLLM_EDGE_MAX_IMAGES='-3': must be at least 1"),
    ("VLLM_EDGE_RMSNORM_PROVIDER", "maybe", "VLLM_EDGE_RMSNORM_PROVIDER='maybe': expected one of"),
    ("VLLM_EDGE_HW_PROFILE", "{oops", "VLLM_EDGE_HW_PROFILE: invalid JSON"),
])
def test_problems_name_a_bad_variable(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    assert any(message in p for p in envs.problems()), envs.problems()


def test_home_that_is_a_file_is_a_problem(monkeypatch, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("VLLM_EDGE_HOME", str(f / "sub"))
    assert any("VLLM_EDGE_HOME" in p and "is a file, not a directory" in p for p in envs.problems())
    monkeypatch.setenv("VLLM_EDGE_HOME", str(tmp_path / "new" / "home"))
    assert not [p for p in envs.problems() if "VLLM_EDGE_HOME" in p]
