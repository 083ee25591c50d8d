"""The results contract: every DAG stage writes `results/<exp>/<stage>/<name>.json` as
`{"schema": "<stage>/v1", "experiment", "config", "env": {gpu, torch, commit}, "metrics": {...}}`
(step series go to CSV beside it). The report reads only these files, so an external framework that
writes a conforming file shows up in the tables as a new baseline.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import torch


def env_info() -> dict:
    """Hardware and software identity of this run (GPU name or CPU, torch version, git commit)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"gpu": gpu, "torch": torch.__version__, "commit": os.environ.get("MINITE_COMMIT", commit)}


def write_json(path: str | Path, payload: dict) -> Path:
    """Atomic write (tmp + rename): an interrupted run never leaves a half-written result behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n")
    tmp.replace(path)
    return path


def write_result(path, *, stage: str, experiment: str, config: dict, metrics: dict, **extra) -> Path:
    payload = {"schema": f"{stage}/v1", "experiment": experiment, "config": config, "env": env_info(),
               "metrics": metrics, **extra}
    return write_json(path, payload)


def read_result(path, stage: str | None = None) -> dict:
    payload = json.loads(Path(path).read_text())
    if stage is not None and payload.get("schema") != f"{stage}/v1":
        raise ValueError(f"{path}: schema {payload.get('schema')!r} is not {stage}/v1")
    return payload


def _jsonable(obj):
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
