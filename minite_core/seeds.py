"""Every seed derivation of the project, in one place (STYLE.md: "every sample and step derives its seed from (run
seed, step, index); no hidden global RNG").

The scheme: a run is a pure function of (config, run seed, step). Each random draw gets a seed from
`derive_seed(run seed, TAG, step, index, ...)` — splitmix64 chaining of integer keys, so neighbouring keys give
unrelated streams (unlike seed + index) — with a purpose tag from `TAGS` as the first key after the run seed, so
the streams of different purposes never coincide. Resume therefore needs no RNG state (runs/state.py), and a
sampler row's draws do not depend on which other rows share its batch.

A few derivations are not `derive_seed` chains; they are kept as they were when the results were first made, so
that committed numbers reproduce, and each says what it is:
- the backward of one GEMM: dgrad operand `2 * seed`, wgrad operand `2 * seed + 1` (one module seed, two streams);
- expert e of a grouped GEMM: `seed + e * EXPERT_SEED_STRIDE` (a prime: no collision below 1e6 experts);
- task data: `task_stream_seed(seed, level, split)`, an affine map (random.Random takes any int);
- lm-eval multiple-choice candidates: `choice_seed(seed, index)`, a blake2b hash (stable across Python versions).
`derive_seed` returns 48 bits, which leaves headroom for the first two inside torch.Generator's 64-bit range.
"""
from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1
EXPERT_SEED_STRIDE = 1_000_003  # a prime: per-expert SR seeds never collide for < 1e6 experts

# Purpose tags: the first key after the run seed.
TAGS = {
    "init": 1,  # model init (pretrain); the choice of calibration examples (task.data.calibration_examples)
    "batch": 2,  # the prompts of step s
    "sample": 3,  # the sampler's seed of step s (rows then derive_seed(that, row))
    "learner": 4,  # the learner's run seed (modules then derive_seed(that, step, j))
    "eval": 5,
    "diag_prompts": 6,  # `minite diagnose`: random prompts (when no --prompts JSONL)
    "diag_calib": 7,  # `minite diagnose`: random calibration tokens (when no --calib JSONL)
}


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*keys: int) -> int:
    """A 48-bit seed from integer keys (run seed, tag, step, index, ...) by splitmix64 chaining: pure,
    platform-free and well mixed."""
    h = 0
    for key in keys:
        h = _splitmix64(h ^ (int(key) & _MASK64))
    return h & ((1 << 48) - 1)


def tagged(seed: int, tag: str, *keys: int) -> int:
    """derive_seed(seed, TAGS[tag], *keys): the seed of one purpose's draw."""
    return derive_seed(seed, TAGS[tag], *keys)


def row_seed(seed: int, row: int) -> int:
    """The sampler's per-row stream (also vLLM's per-request SamplingParams.seed)."""
    return derive_seed(seed, row)


def module_seed(seed: int, step: int, index: int) -> int:
    """Stochastic-rounding seed of GEMM module `index` (modules() order) at optimizer step `step`."""
    return derive_seed(seed, step, index)


def dgrad_seed(seed: int) -> int:
    return 2 * seed


def wgrad_seed(seed: int) -> int:
    return 2 * seed + 1


def expert_seed(seed: int, expert: int) -> int:
    return seed + expert * EXPERT_SEED_STRIDE


def task_stream_seed(seed: int, level: int, stream: int) -> int:
    """Task data: independent integer seed per (run seed, level, stream); stream 0 = train, 1 = held-out."""
    return (int(seed) * 1_000_003 + level) * 101 + stream


def example_seed(seed: int, index: int) -> int:
    """A single task example drawn outside a split (the vLLM peer's prompts)."""
    return seed * 100_003 + index


def choice_seed(seed: int, index: int) -> int:
    """Seed of lm-eval doc `index`'s multiple-choice candidates: blake2b of (seed, "mc", index)."""
    digest = hashlib.blake2b(f"{int(seed)}/mc/{int(index)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: a non-negative int64


def survey_sr_seed(seed: int) -> int:
    """The quantization-error survey's stochastic-rounding generator."""
    return seed + 1
