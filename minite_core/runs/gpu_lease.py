"""One GPU per job on a machine with several: `--gpu-lease GxS` (G GPUs, S jobs a GPU).

Snakemake's local executor counts GPU slots (`--resources gpu=<gpu_slots>`) but does not say which GPU a job
should use, so every job would start on GPU 0. With `gpus: G` in the experiment config the DAG passes
`--gpu-lease Gx<gpu_slots / G>` to every command that computes (rule_args.run_options), and the command leases a
slot before CUDA starts:
- a slot is a lock file, `<lock dir>/gpu<g>.slot<s>`, taken with flock(LOCK_EX | LOCK_NB); slot s of every GPU is
  tried before slot s + 1 of any, so jobs spread over the GPUs before they share one;
- the lock is held by an open descriptor until the process exits; the kernel drops it however the process ends
  (a killed job frees its GPU);
- the process then sees only its GPU (CUDA_VISIBLE_DEVICES=g, so it is `cuda` / `cuda:0` to the code).
A G above the GPUs the machine has (NVML's count) is a one-line error that names the config key to change.
When every slot is taken (a command started by hand beside the DAG) it waits, saying so once. Nothing is leased
under torchrun (LOCAL_RANK: each rank already has its GPU) or when CUDA_VISIBLE_DEVICES is set (Slurm, a user).
The lock directory is per user and machine (MINITE_GPU_LOCKS, default <tmp>/minite-gpus-<uid>), so two DAGs on one
machine share its GPUs.
"""
from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

_held: list[int] = []  # descriptors of the slots this process holds (kept open: the lease lives as long as they do)


def parse(spec: str) -> tuple[int, int]:
    """'GxS' -> (G GPUs, S slots a GPU), both >= 1."""
    try:
        gpus, slots = (int(x) for x in spec.lower().split("x"))
    except ValueError:
        raise ValueError(f"--gpu-lease {spec!r}: expected GxS (GPUs x jobs a GPU), e.g. 8x2") from None
    if gpus < 1 or slots < 1:
        raise ValueError(f"--gpu-lease {spec!r}: GPUs and jobs a GPU must be >= 1")
    return gpus, slots


def lock_dir() -> Path:
    return Path(os.environ.get("MINITE_GPU_LOCKS") or Path(tempfile.gettempdir()) / f"minite-gpus-{os.getuid()}")


def try_lease(gpus: int, slots: int, where: Path) -> tuple[int, int] | None:
    """Take the first free slot in spreading order -> (gpu, slot), or None when all are taken."""
    where.mkdir(parents=True, exist_ok=True)
    for s in range(slots):
        for g in range(gpus):
            fd = os.open(where / f"gpu{g}.slot{s}", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _held.append(fd)
            return g, s
    return None


def release() -> None:
    """Give back every slot this process holds (process exit does the same)."""
    while _held:
        os.close(_held.pop())


def machine_gpus() -> int | None:
    """The GPUs NVML sees (CUDA not started, so CUDA_VISIBLE_DEVICES can still be set), or None where NVML cannot
    say."""
    try:
        n = torch.cuda._raw_device_count_nvml()
    except (AttributeError, OSError):  # no NVML library (a CPU machine), or a torch without the helper
        return None
    return n if n >= 0 else None


def lease(spec: str, *, poll_s: float = 2.0) -> int | None:
    """Lease a GPU for this process and make it the only one CUDA shows -> its index, or None where nothing is
    leased (torchrun rank, CUDA_VISIBLE_DEVICES already set). Call before CUDA starts."""
    gpus, slots = parse(spec)
    if "LOCAL_RANK" in os.environ or os.environ.get("CUDA_VISIBLE_DEVICES"):
        return None
    if torch.cuda.is_initialized():
        raise RuntimeError("--gpu-lease: CUDA already started in this process; the lease must come first")
    have = machine_gpus()
    if have is not None and have < gpus:
        raise ValueError(f"--gpu-lease {spec}: this machine has {have} GPU(s), not {gpus}; set `gpus: {have}` in "
                         "the experiment config (or run its config on a machine that has them)")
    where, waited = lock_dir(), False
    while (got := try_lease(gpus, slots, where)) is None:
        if not waited:
            print(f"gpu lease: all {gpus}x{slots} slots in {where} are taken; waiting for one", file=sys.stderr,
                  flush=True)
            waited = True
        time.sleep(poll_s)
    g, s = got
    os.environ["CUDA_VISIBLE_DEVICES"] = str(g)
    print(f"gpu lease: GPU {g} (slot {s + 1} of {slots})", file=sys.stderr, flush=True)
    return g
