"""Engines: the learner (full-sequence response log-probs, the numbers the RL loss uses) and the sampler
(KV-cache batched generation with processed log-probs), each running one execution profile on a shared model."""
from minite_core.engines.batching import pack_left, pack_right
from minite_core.engines.learner import Learner
from minite_core.engines.sampler import Rollout, Sampler, processed_logprobs

__all__ = ["Learner", "Sampler", "Rollout", "processed_logprobs", "pack_left", "pack_right"]
