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
- ``<dir>/state.pt``: ``{"step", "model", "amax", "optimizer", "config", "extra"}`` (torch.save behind a sha256
  header; fp32 masters, exact). ``amax`` = the calibrated static activation scales (``input_amax`` buffers): they were measured once on
  the initial weights, so a resumed run must restore them, not re-calibrate on moved weights.
- the step log, a CSV with one row per step (``StepLog``); on resume the rows after the checkpoint's step are
  dropped, so steps replayed after a crash are not logged twice.

Resume checks what it resumes (`resume`): a state that cannot be read or whose checksum does not match, or a
step log that does not hold exactly the steps 1..N of the checkpoint (deleted, cut short, edited), stops the run
with an error naming the file — a partial log is never reused.

A run directory is never overwritten by another run. Its state, or its finished results file (summary.json,
pretrain.json) when the state is gone, records the config that made it; a run of another config (another
profile, lr, seed, input or code: `fingerprint`) is an error naming the keys that differ and the two ways on:
another output directory, or `--restart`, which moves the old run (its outputs and state) to
`<run dir>/previous/<date-time>/` and starts over. `on_change="restart"` (`--restart-if-changed`) does that move
without asking — what the DAG and `minite sweep` pass, since they rerun a job only when its config changed.

Checksums (`write_state_file` / `read_state_file`): state.pt is a one-line header `minite-state sha256 <hex>`
followed by the torch.save payload; the hash is computed from the bytes in memory while writing and checked on
the one read of the file on load, so a flipped byte is an error naming the file, not a later "non-finite loss".

Differs from the usual ``torch.save(everything)`` + ``torch.get_rng_state()`` checkpoints: there is no global RNG
to save because none is used, which is also what makes the sampler's draws independent of batching order.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import torch

from minite_core.results import atomic_write_bytes
from minite_core.runs.lock import LOCK
from minite_core.runs.steplog import StepLog

_AMAX = ".input_amax"
STATE = "state.pt"
PREVIOUS = "previous"  # <run dir>/previous/<date-time>/: runs set aside by --restart
RESTART_HINT = "rerun with --restart (the old run is kept under <run dir>/previous/) to start the run over"
_MAGIC = b"minite-state sha256 "  # + 64 hex digits + newline, then the torch.save payload
_ZIP = b"PK"  # a plain torch.save file (written before checksums): read without one


class DamagedState(ValueError):
    """The resume state or its step log cannot be trusted; the message names the file."""


class OtherRun(ValueError):
    """The state was saved by a run with another config (inputs, code): not this run's to resume."""


def write_state_file(path: str | Path, state: dict) -> Path:
    """torch.save(state) behind its sha256 header, atomically (module docstring)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getbuffer()
    header = _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
    return atomic_write_bytes(path, header, payload)


def read_state_file(path: str | Path) -> dict:
    """The dict `write_state_file` wrote, its checksum verified; DamagedState naming the file otherwise."""
    path = Path(path)
    raw = path.read_bytes()
    n = len(_MAGIC) + 65
    if raw.startswith(_MAGIC):
        digest, payload = raw[len(_MAGIC):n - 1].decode("ascii", "replace"), memoryview(raw)[n:]
        if hashlib.sha256(payload).hexdigest() != digest:
            raise DamagedState(f"{path} is damaged: its sha256 does not match its header (a changed or truncated "
                               f"byte); {RESTART_HINT}")
    elif raw.startswith(_ZIP):
        payload = memoryview(raw)
    else:
        raise DamagedState(f"{path} is not a minite state file (no checksum header); {RESTART_HINT}")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
        state["config"], int(state["step"])
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing here: a damaged file
        raise DamagedState(f"{path} cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                           f"{RESTART_HINT}") from None
    return state


def save_state(directory: str | Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               config: dict, extra: dict | None = None) -> Path:
    """Write ``<directory>/state.pt`` atomically, with its checksum; returns its path."""
    state = model.state_dict()
    params = {k: v.detach().cpu().clone() for k, v in state.items() if not k.endswith(_AMAX)}
    amax = {k: v.detach().cpu().clone() for k, v in state.items() if k.endswith(_AMAX)}
    return write_state_file(Path(directory) / STATE, {
        "step": int(step), "model": params, "amax": amax, "optimizer": optimizer.state_dict(), "config": config,
        "extra": extra or {}})


def _apply(state: dict, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    missing = [k for k in missing if not k.endswith(_AMAX)]
    if missing or unexpected:
        raise DamagedState(f"{path} does not match the model (missing={missing[:4]} unexpected={unexpected[:4]}); "
                           f"{RESTART_HINT}")
    device = next(model.parameters()).device
    for name, t in state.get("amax", {}).items():  # None buffers are not in state_dict(): set them by name
        model.get_submodule(name[: -len(_AMAX)]).input_amax = t.to(device)
    optimizer.load_state_dict(state["optimizer"])
    return {"step": int(state["step"]), "extra": state["extra"]}


def load_state(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               config: dict) -> dict | None:
    """Restore model + optimizer from ``<directory>/state.pt`` if present -> {"step", "extra"}; None if absent.
    Raises OtherRun if the saved config differs from ``config``, DamagedState if the file cannot be used."""
    path = Path(directory) / STATE
    if not path.exists():
        return None
    state = read_state_file(path)
    if state["config"] != config:
        raise OtherRun(f"{path}: saved by a run with a different config ({config_diff(state['config'], config)})")
    return _apply(state, path, model, optimizer)


def config_diff(saved: dict, config: dict, limit: int = 6) -> str:
    """The keys two run configs differ in, with their values (`inputs`: what its fingerprint covers)."""
    parts = []
    for k in sorted(set(saved) | set(config), key=str):
        a, b = saved.get(k, "(absent)"), config.get(k, "(absent)")
        if a != b:
            parts.append(f"{k} (the checkpoint, data or minite_core code)" if k == "inputs" else
                         f"{k}: {_short(a)} -> {_short(b)}")
    return "; ".join(parts[:limit]) + (f"; {len(parts) - limit} more" if len(parts) > limit else "")


def _short(v) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def set_aside(run_dir: str | Path, state_dir: str | Path, outputs: tuple[str, ...]) -> Path | None:
    """Move a run (`outputs` of run_dir, the state directory's files but its LOCK, held by this process) to
    `<run_dir>/previous/<date-time>/`; -> that folder, None when there was nothing to move."""
    run_dir, state_dir = Path(run_dir), Path(state_dir)
    moves = [(run_dir / name, name) for name in outputs if (run_dir / name).exists()]
    if state_dir.is_dir():
        skip = {LOCK, PREVIOUS, *(outputs if state_dir.resolve() == run_dir.resolve() else ())}
        moves += [(p, f"state/{p.name}") for p in sorted(state_dir.iterdir())
                  if p.name not in skip and not p.name.endswith(".tmp")]
    if not moves:
        return None
    dest = run_dir / PREVIOUS / time.strftime("%Y%m%d-%H%M%S")
    for i in range(1, 1000):  # two restarts within a second
        if not dest.exists():
            break
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{i}")
    for src, name in moves:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest / name)
    return dest


def _check_log(log: StepLog, step: int, state_path: Path) -> None:
    """The log must hold steps 1..step (then possibly later ones, replayed after the checkpoint)."""
    try:
        steps = [int(r["step"]) for r in log.rows()]
    except (KeyError, ValueError, TypeError) as e:
        raise DamagedState(f"{log.path} is not a step log ({e}); {RESTART_HINT}") from None
    if steps[:step] != list(range(1, step + 1)):
        have = f"steps {steps[0]}..{steps[-1]} ({len(steps)} rows)" if steps else "no rows"
        raise DamagedState(f"{log.path} has {have} but {state_path} is at step {step}: the log is missing or "
                           f"damaged and would silently lose steps; {RESTART_HINT}")


def _saved_config(state: dict | None, result: Path | None) -> dict | None:
    """The config of the run already in the directory: its state's, else its finished results file's."""
    if state is not None:
        return state["config"]
    if result is None or not result.exists():
        return None
    try:
        return json.loads(result.read_text())["config"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise DamagedState(f"{result} is not a results file ({e}); {RESTART_HINT}") from None


def resume(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict,
           log_name: str, restart: bool = False, on_change: str = "error", run_dir: str | Path | None = None,
           outputs: tuple[str, ...] = (), result: str | None = None) -> tuple[int, dict, StepLog]:
    """-> (step, extra, step log) of this run: resumed from the state in ``directory`` (checked: module
    docstring) or fresh (step 0, empty log). ``run_dir`` (default: directory) holds the run's ``outputs`` (names)
    and its results file ``result`` (a name among them). ``restart``: set the run aside first (`set_aside`).
    A run of another config there: OtherRun naming the differing keys, or (on_change="restart") set aside."""
    if on_change not in ("error", "restart"):
        raise ValueError(f"on_change must be 'error' or 'restart', got {on_change!r}")
    directory = Path(directory)
    run_dir = Path(run_dir) if run_dir is not None else directory
    state_path, log = directory / STATE, StepLog(directory / log_name)
    if restart:
        _announce(set_aside(run_dir, directory, outputs), "--restart")
    state = read_state_file(state_path) if state_path.exists() else None
    saved = _saved_config(state, run_dir / result if result else None)
    if saved is not None and saved != config:
        diff = config_diff(saved, config)
        if on_change == "error":
            raise OtherRun(f"{run_dir} holds a run of another config ({diff}); give this run another --out, or "
                           f"pass --restart to start over there (the old run is kept under {run_dir / PREVIOUS}/)")
        _announce(set_aside(run_dir, directory, outputs), f"its config changed ({diff})")
        state = None
    if state is None:
        log.path.unlink(missing_ok=True)
        return 0, {}, StepLog(log.path)
    resumed = _apply(state, state_path, model, optimizer)
    _check_log(log, resumed["step"], state_path)
    log.truncate(resumed["step"])
    return resumed["step"], resumed["extra"], log


def _announce(dest: Path | None, why: str) -> None:
    if dest is not None:
        print(f"starting over ({why}): the previous run is kept in {dest}", flush=True)


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
