"""The JSON-schema subset checker agrees with the `jsonschema` package on the subset it covers."""

from __future__ import annotations

import pytest

from vllm_edge.common.schema import schema_errors

jsonschema = pytest.importorskip("jsonschema")

TAP = {"type": "object", "properties": {"index": {"type": "integer"}}, "required": ["index"]}
KEY = {"type": "object", "properties": {"key": {"type": "string", "enum": ["BACK", "HOME"]}},
       "required": ["key"], "additionalProperties": False}
ARR = {"type": "array", "items": {"type": ["number", "null"]}}

CASES = [
    (TAP, {"index": 3}), (TAP, {"index": 3.5}), (TAP, {"index": True}), (TAP, {"index": "3"}), (TAP, {}),
    (TAP, {"index": 1, "extra": "ok"}), (TAP, [1]), (KEY, {"key": "BACK"}), (KEY, {"key": "back"}),
    (KEY, {"key": "HOME", "x": 1}), (KEY, {"key": None}), (ARR, [1, 2.5, None]), (ARR, [1, "2"]), (ARR, {}),
    ({"type": "boolean"}, False), ({"type": "boolean"}, 0), ({"type": "string"}, "s"), ({"type": "null"}, None),
]


@pytest.mark.parametrize("schema,value", CASES)
def test_agrees_with_jsonschema(schema, value):
    ours = not schema_errors(value, schema)
    theirs = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert ours == theirs, (schema, value, schema_errors(value, schema))


def test_errors_name_the_path():
    assert schema_errors({"key": "back"}, KEY) == ["$.key: 'back' not in ['BACK', 'HOME']"]
    assert schema_errors([1, "2"], ARR) == ["$[1]: expected ['number', 'null'], got str"]
    assert schema_errors({}, TAP) == ["$: missing 'index'"]


def test_a_type_that_is_not_json_schema_is_reported_not_raised():
    assert schema_errors(1, {"type": "int"}) == ["$: the schema's type 'int' is not a JSON-schema type"]
