"""Engines: the learner (full-sequence response log-probs, the numbers the RL loss uses) and the sampler
(KV-cache batched generation with processed log-probs: the reference loop and the fast static-buffer / CUDA-graph
decode, `make_sampler` picks one), each running one execution profile on a shared model."""
from minite_core.engines.fast_sampler import FastSampler, make_sampler, resolve_engine
from minite_core.engines.learner import Learner, gemm_modules, pack_right
from minite_core.engines.sampler import Rollout, Sampler, derive_seed, processed_logprobs

__all__ = ["Learner", "Sampler", "FastSampler", "make_sampler", "resolve_engine", "Rollout", "derive_seed", "processed_logprobs",
           "gemm_modules", "pack_right"]
