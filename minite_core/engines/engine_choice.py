"""Which rollout engine runs: the names and the automatic choice. Light on purpose (torch only): the run options
(runs.execution) resolve it before a command imports the model code, triton included."""
from __future__ import annotations

import torch

ENGINES = ("reference", "fast", "fast-eager")


def resolve_engine(engine: str | None, device) -> str:
    """engine (a command's resolved execution passes it, runs.execution), else "fast" on CUDA and "reference" on
    CPU (there both give the same bits — tests/test_fast_sampler.py — and the reference is the readable
    definition); checked."""
    name = engine or ("fast" if torch.device(device).type == "cuda" else "reference")
    if name not in ENGINES:
        raise ValueError(f"unknown sampler engine {name!r}; one of {list(ENGINES)}")
    return name
