"""What an RL-stage run persists, and why that is enough to resume it exactly.

A run (SFT pretraining or GRPO) is a pure function of (config, run seed, step): every random draw — the batch of
prompts at step s, the sampler's seed for response i of step s, the stochastic-rounding seeds of the learner —
comes from ``seeds.derive_seed(run_seed, tag, step, index)`` (integer tags, ``seeds.TAGS``). So a checkpoint
needs no RNG state: model parameters, the optimizer state, the step, and the config the run was started with
(checked on resume: ``load_state`` raises on a different config rather than silently mixing two runs; the config
includes a ``fingerprint`` of the inputs and the code, so a changed run recomputes). Killing a run and resuming it
replays the same steps bit for bit on the same
machine (tests/test_rl_loop.py checks it row by row).

Files (all written atomically: temp file + ``os.replace``, so an interruption leaves the previous good state):
- ``<dir>/state.pt``: ``{"step", "model", "amax", "optimizer", "config", "extra"}`` (torch.save; fp32 masters,
  exact). ``amax`` = the calibrated static activation scales (``input_amax`` buffers): they were measured once on
  the initial weights, so a resumed run must restore them, not re-calibrate on moved weights.
- the step log, a CSV with one row per step (``StepLog``); on resume the rows after the checkpoint's step are
  dropped, so steps replayed after a crash are not logged twice.

Differs from the usual ``torch.save(everything)`` + ``torch.get_rng_state()`` checkpoints: there is no global RNG
to save because none is used, which is also what makes the sampler's draws independent of batching order.

Configs are frozen dataclasses; ``config_from_json`` builds one from the JSON a Snakemake rule passes on the
command line (unknown keys are an error; lists become tuples so the dataclass stays hashable).
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import torch


# ----------------------------------------------------------------------------------------------- configs
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


# ----------------------------------------------------------------------------------------------- state
_AMAX = ".input_amax"


def _atomic_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_state(directory: str | Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               config: dict, extra: dict | None = None) -> Path:
    """Write ``<directory>/state.pt`` atomically; returns its path."""
    path = Path(directory) / "state.pt"
    buf = io.BytesIO()
    state = model.state_dict()
    params = {k: v.detach().cpu().clone() for k, v in state.items() if not k.endswith(_AMAX)}
    amax = {k: v.detach().cpu().clone() for k, v in state.items() if k.endswith(_AMAX)}
    torch.save({"step": int(step), "model": params, "amax": amax, "optimizer": optimizer.state_dict(),
                "config": config, "extra": extra or {}}, buf)
    _atomic_bytes(path, buf.getvalue())
    return path


def load_state(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               config: dict) -> dict | None:
    """Restore model + optimizer from ``<directory>/state.pt`` if present -> {"step", "extra"}; None if absent.
    Raises ValueError if the saved config differs from ``config`` (resuming a different run)."""
    path = Path(directory) / "state.pt"
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["config"] != config:
        diff = sorted(k for k in set(state["config"]) | set(config) if state["config"].get(k) != config.get(k))
        raise ValueError(f"{path}: saved by a run with a different config (keys {diff}); delete it to restart")
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    missing = [k for k in missing if not k.endswith(_AMAX)]
    if missing or unexpected:
        raise ValueError(f"{path}: state does not match the model: missing={missing[:8]} unexpected={unexpected[:8]}")
    device = next(model.parameters()).device
    for name, t in state.get("amax", {}).items():  # None buffers are not in state_dict(): set them by name
        model.get_submodule(name[: -len(_AMAX)]).input_amax = t.to(device)
    optimizer.load_state_dict(state["optimizer"])
    return {"step": state["step"], "extra": state["extra"]}


def resume_or_fresh(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    config: dict) -> dict | None:
    """`load_state`, but a state left by a different run (config, inputs or code) is moved aside to
    ``state.pt.stale`` and the run starts fresh: a killed run resumes, a changed one recomputes."""
    try:
        return load_state(directory, model=model, optimizer=optimizer, config=config)
    except ValueError as err:
        print(f"not resuming: {err}; moving it to state.pt.stale")
        (Path(directory) / "state.pt").replace(Path(directory) / "state.pt.stale")
        return None


def fingerprint(*paths: str | Path) -> str:
    """sha256 (16 hex) of the given files / folders (every file, sorted) and of minite_core's source. Part of a
    run's resume config, so that `snakemake --forceall`, a new base checkpoint or new data after a code change
    recompute instead of resuming a finished run of the old inputs."""
    h = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    files = sorted(package.rglob("*.py"))
    for p in map(Path, paths):
        files += sorted(f for f in p.rglob("*") if f.is_file() and "state" not in f.parts) if p.is_dir() else [p]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def add_run_args(parser, config_help: str) -> None:
    """The arguments every resumable run CLI shares (`minite pretrain`, `minite rl`)."""
    parser.add_argument("--state", default=None, help="resume-state directory (default: <out>/state)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config-json", default="{}", help=config_help)
    parser.add_argument("--experiment", default="adhoc")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (Snakemake's {threads})")
    parser.add_argument("--no-progress", action="store_true")


def parse_run_args(parser, argv, config_cls):
    """-> (args, config): parse, apply --threads, build the frozen config from --config-json."""
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args, config_from_json(config_cls, args.config_json)


# ----------------------------------------------------------------------------------------------- step log
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
        _atomic_bytes(self.path, buf.getvalue().encode())

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
