"""JSONL IO of the task data: one JSON object a line (train.jsonl, heldout.jsonl, calibration files).

`read_jsonl` checks what it reads: a missing file, a line that is not a JSON object, or a row without a field the
caller needs is an error naming the file and line; an empty file is an error (no stage has anything to do with
zero examples). `write_jsonl` is atomic (an interrupted write leaves the previous file, no partial one).
"""
from __future__ import annotations

import json
from pathlib import Path

from minite_core.results import atomic_write_bytes

EXAMPLE_FIELDS = ("prompt", "response", "answer", "level")  # what task.arithmetic.make_example writes


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    atomic_write_bytes(path, text.encode("utf-8"))


def read_jsonl(path: str | Path, fields: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a JSONL file; every row must be an object holding `fields`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (a JSONL file of task examples is expected)")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in fields if k not in row]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing field(s) {missing} (rows need {list(fields)})")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no rows: an empty example file")
    return rows
