"""Exact resume of a sharded (FSDP2) learner: torch.distributed.checkpoint (DCP), one shard file per rank.

What is saved is what runs/state.py saves for one process — model parameters and buffers (the calibrated
`input_amax` scales included), the optimizer state, the step — so that, runs being pure functions of (config,
seed, step) (runs/state.py), a resumed run repeats the straight run bit for bit. The state dicts come from
torch.distributed.checkpoint.state_dict.get_state_dict: parameters and AdamW moments stay sharded DTensors, each
rank writes only its shard, and loading re-shards onto the current ranks (DCP resharding also lets a run resume
on another world size; the test checks the same one).

Atomic (nothing lost on interruption): rank 0 names the checkpoint in `<dir>/latest` (atomic_write_bytes) only
after every rank's shard of `<dir>/step-<k>` is written (DCP's save ends with a collective finish); a run killed
mid-save resumes from the previous `latest`. Older step directories are removed after the switch.

Checksums: `latest` also holds the sha256 of every file of the step directory (rank 0 hashes them after the save).
Before loading, the ranks check them, each its share of the files, and agree (one all-gather): a changed, truncated
or missing file stops every rank with DamagedState naming it — never a silent load of damaged weights, and never one
rank waiting in DCP's collectives for another that raised.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from minite_core.nn import clear_weight_caches
from minite_core.results import atomic_write_bytes
from minite_core.runs.state import RESTART_HINT, DamagedState

LATEST = "latest"


def save_sharded(directory: str | Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 config: dict | None = None) -> Path:
    """Collective: every rank calls it. -> the step directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory = Path(directory)
    target = directory / f"step-{step}"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(target))
    dist.barrier()
    if dist.get_rank() == 0:
        old = _latest(directory)
        digests = {str(f.relative_to(target)): _sha256(f) for f in sorted(target.rglob("*")) if f.is_file()}
        atomic_write_bytes(directory / LATEST, json.dumps({"step": step, "dir": target.name, "config": config or {},
                                                           "sha256": digests}).encode())
        if old is not None and old["dir"] != target.name:
            shutil.rmtree(directory / old["dir"], ignore_errors=True)
    dist.barrier()
    return target


def load_sharded(directory: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 config: dict | None = None) -> int:
    """Collective. Restores the latest checkpoint into the (already sharded) model and its optimizer -> its step.
    A missing checkpoint or one of another config raises ValueError naming the directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    directory = Path(directory)
    latest = _latest(directory)
    if latest is None:
        raise ValueError(f"no sharded checkpoint in {directory} (no {LATEST} file): start the run without resume")
    if config is not None and latest["config"] != config:
        raise ValueError(f"sharded checkpoint {directory} is of another config: resume with the same config or "
                         "start over in a new directory")
    verify_files(directory / latest["dir"], latest.get("sha256"))
    model_sd, optim_sd = get_state_dict(model, optimizer)  # initialises the optimizer's state to load into
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(directory / latest["dir"]))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    clear_weight_caches(model)  # quantized operands of the pre-load weights
    return int(latest["step"])


def verify_files(step_dir: Path, digests: dict | None) -> None:
    """Collective where a process group is up: each rank hashes its share of the step directory's files (every
    world-th, by name), then the ranks gather the damaged names, so all raise DamagedState together, naming them.
    digests None: a checkpoint written without checksums, loaded as it is."""
    if digests is None:
        return
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    bad = []
    for i, (name, digest) in enumerate(sorted(digests.items())):
        if i % world == rank:
            path = step_dir / name
            if not path.is_file() or _sha256(path) != digest:
                bad.append(name if path.is_file() else f"{name} (missing)")
    if dist.is_initialized():
        found = [None] * world
        dist.all_gather_object(found, bad)
        bad = sorted(name for names in found for name in names)
    if bad:
        raise DamagedState(f"sharded checkpoint {step_dir} is damaged: {', '.join(bad)} does not match the sha256 "
                           f"in {step_dir.parent / LATEST}; {RESTART_HINT}")


def _sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _latest(directory: Path) -> dict | None:
    path = directory / LATEST
    return json.loads(path.read_text()) if path.is_file() else None
