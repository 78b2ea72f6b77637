"""The output contract of every harness arm: its metrics are the last JSON object
line it prints on stdout (vLLM logs to stdout too, so the line must come last)."""

from __future__ import annotations

import json
from typing import Any


def last_json_line(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON object line in the output")
