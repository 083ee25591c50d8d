"""Engines: the learner (full-sequence response log-probs, the numbers the RL loss uses) and the sampler
(KV-cache batched generation with processed log-probs: the reference loop and the fast static-buffer /
CUDA-graph decode, `make_sampler` picks one), each running one execution profile on a shared model,
and what they share (batching, the mismatch metrics, the calibration path). Names resolve lazily (PEP 562), so
importing a light submodule (engines.mismatch) does not load the model."""
from __future__ import annotations

import importlib

_EXPORTS = {"Learner": "learner", "Sampler": "sampler", "Rollout": "sampler", "processed_logprobs": "sampler",
            "FastSampler": "fast_sampler", "make_sampler": "fast_sampler", "resolve_engine": "engine_choice",
            "pack_left": "batching", "pack_right": "batching"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"minite_core.engines.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'minite_core.engines' has no attribute {name!r}")
