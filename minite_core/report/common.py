"""What every report section shares: reading a results file, formatting a number, a markdown table, and where the
committed peer measurements live. Kept apart from build.py so that section modules (claims.py, te.py) can use them
without importing build.py, which imports them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path


def load(path: Path) -> dict | None:
    """The JSON at path, None when the stage has not written it; a broken file is an error naming it."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid results file ({e}); rerun the stage that writes it") from None


def fmt(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
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
