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

Resume checks what it resumes (`resume`): a state that cannot be read, or a step log that does not hold exactly
the steps 1..N of the checkpoint (deleted, cut short, edited), stops the run with an error naming the file —
a partial log is never reused; `--restart` (``restart=True``) discards both and starts over. A state left by a
different run (config, inputs or code changed) is moved aside to ``state.pt.stale`` and the run recomputes.

Differs from the usual ``torch.save(everything)`` + ``torch.get_rng_state()`` checkpoints: there is no global RNG
to save because none is used, which is also what makes the sampler's draws independent of batching order.
"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import torch

from minite_core.results import atomic_write_bytes
from minite_core.runs.steplog import StepLog

_AMAX = ".input_amax"
STATE = "state.pt"
RESTART_HINT = "rerun with --restart (or delete the state directory) to start the run over"


class DamagedState(ValueError):
    """The resume state or its step log cannot be trusted; the message names the file."""


class OtherRun(ValueError):
    """The state was saved by a run with another config (inputs, code): not this run's to resume."""


def save_state(directory: str | Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               config: dict, extra: dict | None = None) -> Path:
    """Write ``<directory>/state.pt`` atomically; returns its path."""
    path = Path(directory) / STATE
    buf = io.BytesIO()
    state = model.state_dict()
    params = {k: v.detach().cpu().clone() for k, v in state.items() if not k.endswith(_AMAX)}
    amax = {k: v.detach().cpu().clone() for k, v in state.items() if k.endswith(_AMAX)}
    torch.save({"step": int(step), "model": params, "amax": amax, "optimizer": optimizer.state_dict(),
                "config": config, "extra": extra or {}}, buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


def load_state(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               config: dict) -> dict | None:
    """Restore model + optimizer from ``<directory>/state.pt`` if present -> {"step", "extra"}; None if absent.
    Raises OtherRun if the saved config differs from ``config``, DamagedState if the file cannot be used."""
    path = Path(directory) / STATE
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        saved_config, step = state["config"], int(state["step"])
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing here: a damaged file
        raise DamagedState(f"{path} cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                           f"{RESTART_HINT}") from None
    if saved_config != config:
        diff = sorted(k for k in set(saved_config) | set(config) if saved_config.get(k) != config.get(k))
        raise OtherRun(f"{path}: saved by a run with a different config (keys {diff})")
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    missing = [k for k in missing if not k.endswith(_AMAX)]
    if missing or unexpected:
        raise DamagedState(f"{path} does not match the model (missing={missing[:4]} unexpected={unexpected[:4]}); "
                           f"{RESTART_HINT}")
    device = next(model.parameters()).device
    for name, t in state.get("amax", {}).items():  # None buffers are not in state_dict(): set them by name
        model.get_submodule(name[: -len(_AMAX)]).input_amax = t.to(device)
    optimizer.load_state_dict(state["optimizer"])
    return {"step": step, "extra": state["extra"]}


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


def resume(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict,
           log_name: str, restart: bool = False) -> tuple[int, dict, StepLog]:
    """-> (step, extra, step log) of this run: resumed from ``<directory>`` (checked: module docstring) or fresh
    (step 0, empty log). ``restart``: discard the state and the log first."""
    directory = Path(directory)
    state_path, log = directory / STATE, StepLog(directory / log_name)
    if restart:
        state_path.unlink(missing_ok=True)
        log.path.unlink(missing_ok=True)
    try:
        resumed = load_state(directory, model=model, optimizer=optimizer, config=config)
    except OtherRun as err:
        print(f"not resuming: {err}; moving it to {STATE}.stale")
        state_path.replace(directory / f"{STATE}.stale")
        resumed = None
    if resumed is None:
        log.path.unlink(missing_ok=True)
        return 0, {}, StepLog(log.path)
    _check_log(log, resumed["step"], state_path)
    log.truncate(resumed["step"])
    return resumed["step"], resumed["extra"], log


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
