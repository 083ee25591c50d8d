"""The results contract: every DAG stage writes `results/<exp>/<stage>/<name>.json` as
`{"schema": "<stage>/v1", "experiment", "config", "env": {gpu, torch, commit}, "metrics": {...}}`
(step series go to CSV beside it). The report reads only these files, so an external framework that
writes a conforming file shows up in the tables as a new baseline.

`env` = hardware and software identity (`env_info`) plus what the command executes with and a stage's config does
not say: its execution (runs.execution: kernel backend, rollout engine, the environment variables that decided),
registered once per process (`set_run_env`). Configs travel
as JSON both ways: a rule passes a stage's config section as `--config-json`, `config_from_json` builds the frozen
dataclass (unknown keys are an error naming them), `config_to_dict` is the form the result records.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
from pathlib import Path

import torch


_RUN_ENV: dict = {}  # run options recorded in every result's env (set_run_env)


def set_run_env(**items) -> None:
    """Record run options (e.g. kernels="reference") in the `env` of every result this process writes."""
    _RUN_ENV.update(items)


def env_info() -> dict:
    """Hardware and software identity of this run (GPU name or CPU, torch version, git commit) + run options."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"gpu": gpu, "torch": torch.__version__, "commit": os.environ.get("MINITE_COMMIT", commit), **_RUN_ENV}


def atomic_write_bytes(path: str | Path, *chunks: bytes | memoryview) -> Path:
    """Write `chunks` (one file, in order) via `<path>.tmp` + rename: an interruption leaves the previous file (or
    none), never half of one, and a failed write removes its `.tmp`. Several chunks spare a large payload the copy
    of joining it to a header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: str | Path, payload: dict) -> Path:
    """Atomic JSON write: an interrupted run never leaves a half-written result behind."""
    text = json.dumps(payload, indent=2, sort_keys=False, default=_jsonable, allow_nan=True) + "\n"
    return atomic_write_bytes(path, text.encode())


def write_result(path, *, stage: str, experiment: str, config: dict, metrics: dict, **extra) -> Path:
    payload = {"schema": f"{stage}/v1", "experiment": experiment, "config": config, "env": env_info(),
               "metrics": metrics, **extra}
    return write_json(path, payload)


def read_result(path, stage: str | None = None) -> dict:
    """A results file. Every way it can be unusable is a ValueError naming it: not JSON (empty, cut short), not a
    JSON object, or (`stage` given) a `schema` field other than `<stage>/v1`."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid results file ({e}); rerun the stage that writes it") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path} is not a results file (a JSON {type(payload).__name__}, not an object); rerun "
                         "the stage that writes it")
    if stage is not None and payload.get("schema") != f"{stage}/v1":
        raise ValueError(f"{path}: schema {payload.get('schema')!r} is not {stage}/v1 (another stage's file, or "
                         "one written by another version); rerun the stage that writes it")
    return payload


def _jsonable(obj):
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# ---- configs as JSON -------------------------------------------------------------------------------------------
def _tuples(value):
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def config_from_dict(cls, data: dict | None):
    """Frozen dataclass ``cls`` from a dict; unknown keys raise ValueError naming them and the known ones."""
    data = dict(data or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known: {sorted(names)}")
    return cls(**{k: _tuples(v) for k, v in data.items()})


def config_from_json(cls, text: str | None):
    return config_from_dict(cls, json.loads(text) if text else {})


def config_to_dict(cfg) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples -> lists: the form it is compared in
