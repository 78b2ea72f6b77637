"""The JSON-schema subset that tool parameters use, checked without a schema library.

Tool-call results are judged against their tool's ``parameters`` schema by the stress
client and the agent suite; neither should depend on a test-only package to do it.
Covered: ``type`` (one or a list), ``enum``, ``properties``, ``required``,
``additionalProperties: false`` and ``items``. Anything else in a schema is not checked.
"""

from __future__ import annotations

from typing import Any


def schema_errors(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Violations of the JSON-schema subset our tools use (type, properties, required,
    enum, additionalProperties: false)."""
    errs: list[str] = []
    typ = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "null": lambda v: v is None,
    }
    if typ is not None:
        types = typ if isinstance(typ, list) else [typ]
        unknown = [t for t in types if t not in checks]
        if unknown:  # not a JSON-schema type: the schema is wrong, not the value
            return [f"{path}: the schema's type {unknown[0]!r} is not a JSON-schema type"]
        if not any(checks[t](value) for t in types):
            return [f"{path}: expected {typ}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errs.append(f"{path}: missing {name!r}")
        for name, v in value.items():
            if name in props:
                errs += schema_errors(v, props[name], f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                errs.append(f"{path}: unexpected {name!r}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            errs += schema_errors(v, schema["items"], f"{path}[{i}]")
    return errs
