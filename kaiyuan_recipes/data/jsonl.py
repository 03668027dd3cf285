"""Reading JSON-lines files line by line, so that every bad line can be reported by number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """(line number, object, None) for each good line, (line number, None, problem) for a bad one;
    blank lines are skipped."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield lineno, None, f"{path}: line {lineno}: not UTF-8 (byte {err.start} of the line)"
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                yield lineno, None, f"line {lineno}: not JSON ({err.msg})"
                continue
            if not isinstance(row, dict):
                yield lineno, None, f"line {lineno}: expected an object"
                continue
            yield lineno, row, None
