"""Token shards: what a GEMM must know when its tokens are one data-parallel rank's slice of a global batch.

What: `token_shard(TokenShard(offset, reduce_max))` around a forward + backward tells every NVFP4 QuantLinear
that its M token rows are rows [offset, offset + M) of the global batch's (flattened) token dim, and how to take
a max over the data-parallel group. Two numerics then change from "this tensor's" to "the global tensor's":

- per-tensor DYNAMIC amaxes of token-carrying operands (`global_amax`): the forward activation x under a
  per-tensor activation spec (te-nvfp4), the dgrad operand dy (every NVFP4 grad spec is per tensor), and both
  wgrad operands xᵀ and dyᵀ (per tensor, after RHT when the profile applies it). Each local amax is all-reduced
  (max) and passed on as a static amax: max is exact and order-free, so S_enc equals the single-process one
  bit for bit. Per-token scales (minite's activations), static (calibrated) scales and weights (every rank
  holds the same full weight once FSDP has gathered it) need nothing;
- stochastic-rounding counters: the Philox stream is indexed by (row, column) of the quantized tensor, so a
  shard draws at its global coordinates (`sr_origin`: (offset, 0) for dy along N, (0, offset) for dyᵀ along
  tokens) and draws exactly what the single process draws for the same element.

With this, every code and scale of a rank's GEMM operands equals the single-process one, provided the 16-token
blocks of the wgrad operands do not straddle ranks (each rank's token count a multiple of 16; the distributed
learner checks it). Outside a shard (`current() is None`) nothing changes: the single-process path is untouched.

Lives in nn/ (not engines/) because the autograd functions read it; the process group itself is the caller's
(engines.distributed passes a closure over torch.distributed.all_reduce).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class TokenShard:
    offset: int  # global (flattened) index of this rank's first token row
    reduce_max: Callable[[torch.Tensor], torch.Tensor]  # fp32 [] -> max over the data-parallel group (all ranks call)


_CURRENT: list[TokenShard | None] = []


def current() -> TokenShard | None:
    """The active token shard (None: a single-process run)."""
    return _CURRENT[-1] if _CURRENT else None


@contextlib.contextmanager
def token_shard(shard: TokenShard | None):
    """Run a forward (and its backward) as one rank's slice of the global batch; None: as whole tensors (the
    expert GEMMs of expert parallelism, which see every token of their experts)."""
    _CURRENT.append(shard)
    try:
        yield shard
    finally:
        _CURRENT.pop()


def global_amax(x: torch.Tensor, shard: TokenShard, *, rht: bool = False, rht_dtype: str = "float32") -> torch.Tensor:
    """amax of |x| over the global tensor that x (M, K) is a token shard of: fp32 [] (a collective: every rank
    calls it at the same point). rht: of the random-Hadamard-transformed rows (along K), as the quantizer sees
    them (rounded to `rht_dtype`) — x is then the transposed (C, T) operand, whose RHT runs along tokens."""
    from minite_core.formats.rht import rht as rht_fn

    x = rht_fn(x, rht_dtype) if rht else x
    return shard.reduce_max(x.detach().float().abs().amax().reshape(()))
