"""The step log of a run: an append-only CSV of per-step metrics, one row per step, flushed every row.

Resume keeps the rows with ``step <= checkpoint step`` (``truncate``) so steps replayed after a crash are not
logged twice; runs/state.py checks before that that the log and the checkpoint agree.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import torch

from minite_core.results import atomic_write_bytes


class StepLog:
    """Append-only CSV of per-step metrics, flushed every row (a killed run loses at most the row in flight).

    Columns are fixed by the first row (later rows may not add keys: a missing metric is written empty, NaN).
    ``truncate(step)`` keeps the rows with ``step <= step`` (resume). Floats are written with ``repr`` so the
    file round-trips exactly and the resume test can compare rows as strings.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.columns: list[str] | None = None
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open(newline="") as f:
                self.columns = next(csv.reader(f), None)

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))

    def truncate(self, step: int) -> None:
        rows = [r for r in self.rows() if int(r["step"]) <= step]
        if self.columns is None:
            return
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.columns, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        atomic_write_bytes(self.path, buf.getvalue().encode())

    def append(self, row: dict[str, Any]) -> None:
        if self.columns is None:
            self.columns = list(row)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(",".join(self.columns) + "\n")
        extra = set(row) - set(self.columns)
        if extra:
            raise ValueError(f"{self.path}: new columns {sorted(extra)} after the header {self.columns}")
        with self.path.open("a", newline="") as f:
            csv.writer(f, lineterminator="\n").writerow([_fmt(row.get(c)) for c in self.columns])


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, torch.Tensor):
        v = v.item()
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    return str(v)
