"""Every exception class vllm-edge defines derives from EdgeError, so `vllm-edge` prints any of
them as one ``error: <message>`` line (src/vllm_edge/cli/__init__.py) instead of a traceback.

The walk imports every module under vllm_edge; a module that cannot be imported here (an
optional dependency missing) is named in a warning, and the package's own modules must import.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

import vllm_edge
from vllm_edge.common.errors import EdgeError

# Exceptions that never reach the CLI (internal control flow), each with its reason. None today.
NOT_EDGE_ERRORS: dict[str, str] = {}
# Modules not imported by the walk: running them is the point of them.
ENTRY_POINTS = {"vllm_edge.cli.__main__"}


def import_everything() -> tuple[list, dict[str, str]]:
    """(modules imported, {module: why it could not be imported})."""
    mods, failed = [vllm_edge], {}
    for info in pkgutil.walk_packages(vllm_edge.__path__, "vllm_edge."):
        if info.name in ENTRY_POINTS or info.name.endswith(".__main__"):
            continue
        try:
            mods.append(importlib.import_module(info.name))
        except ImportError as exc:  # an optional dependency (llama_cpp, matplotlib, ...)
            failed[info.name] = f"{type(exc).__name__}: {exc}"
    return mods, failed


def exception_classes(mods) -> dict[str, type]:
    found = {}
    for mod in mods:
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("vllm_edge"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def offenders(classes: dict[str, type]) -> list[str]:
    return sorted(name for name, cls in classes.items()
                  if not issubclass(cls, EdgeError) and name not in NOT_EDGE_ERRORS)


def test_every_exception_class_derives_from_edge_error():
    mods, failed = import_everything()
    if failed:
        warnings.warn("not walked (cannot import here): "
                      + "; ".join(f"{m} ({why})" for m, why in sorted(failed.items())), stacklevel=1)
    assert len(mods) > 100, f"only {len(mods)} modules imported"
    classes = exception_classes(mods)
    assert "vllm_edge.bench.startup.StartupError" in classes and "vllm_edge.agent.tools.ToolError" in classes
    bad = offenders(classes)
    assert not bad, f"exception classes that `vllm-edge` would print as a traceback: {bad}"
    stale = sorted(set(NOT_EDGE_ERRORS) - {n for n, c in classes.items() if not issubclass(c, EdgeError)})
    assert not stale, f"NOT_EDGE_ERRORS names classes that are EdgeErrors or gone: {stale}"


def test_the_walk_catches_a_plain_exception():
    class Plain(ValueError):
        pass

    Plain.__module__ = "vllm_edge.made_up"

    class Fine(EdgeError, ValueError):
        pass

    Fine.__module__ = "vllm_edge.made_up"
    assert offenders({"vllm_edge.made_up.Plain": Plain, "vllm_edge.made_up.Fine": Fine}) == [
        "vllm_edge.made_up.Plain"]


def test_the_old_bases_stay_for_the_callers_that_catch_them():
    from vllm_edge.agent.adb import AdbError
    from vllm_edge.agent.tools import ToolError
    from vllm_edge.agent.uitree import UiParseError
    from vllm_edge.bench.startup import StartupError

    assert issubclass(StartupError, RuntimeError) and issubclass(AdbError, RuntimeError)
    assert issubclass(ToolError, ValueError) and issubclass(UiParseError, ValueError)
