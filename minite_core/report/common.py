"""What every report section shares: reading a results file, saying why one is absent, formatting a number, a
markdown table, and where the committed peer measurements live. Kept apart from build.py so that section modules
(claims.py, te.py) can use them without importing build.py, which imports them.

Absence and NaN are never the same as "not measured": a results file that is not there is *not run*, or *failed*
when its stage's log exists (the log's last line is shown: the stage's one-line error); a file that is there but
unreadable or of another schema is an error naming it; a NaN value prints as NaN ("–" is only for a value the
file does not have).
"""
from __future__ import annotations

import math
from pathlib import Path

from minite_core.results import read_result

NOT_RUN = "not run"


def load(path: Path, stage: str) -> dict | None:
    """The results file at path, schema `<stage>/v1` (results.read_result: any other content is an error naming
    it); None when the stage has not written it."""
    return read_result(path, stage) if path.exists() else None


def absent(results: Path, log: str) -> str:
    """Why a results file is missing, in markdown (`log`: the stage's log under results/<exp>/, e.g.
    logs/diagnostics.log): `_not run_` without a log; `**failed**` when the log ends in an error (its last line:
    the stage's one-line error); else `**missing**` (the stage ran, killed or its file removed since)."""
    path = results / log
    if not path.exists():
        return f"_{NOT_RUN}_"
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    last = lines[-1][:300] if lines else "(empty log)"
    word = "failed" if "error" in last.lower() or "Traceback" in "".join(lines[-20:]) else "missing"
    return f"**{word}** (`{log}` ends: `{last}`)"


def fmt(v, digits=3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float):
        return f"{v:.{digits}e}" if (v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5)) else f"{v:.{digits}f}"
    return str(v)


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def vllm_peer_dir(results: Path) -> Path:
    """The committed real-vLLM measurement (results/vllm-cpu/vllm_peer), shared by every experiment's report."""
    return results.parent / "vllm-cpu" / "vllm_peer"
