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

"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import torch

from minite_core.results import atomic_write_bytes

_AMAX = ".input_amax"


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
    atomic_write_bytes(path, buf.getvalue())
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
