"""Scale-out learner: data parallelism over the batch, FSDP2 sharding of parameters, gradients and AdamW state,
with the single-process numerics of every profile.

How: launched by `torchrun --nproc-per-node N` (`init_from_env`), or by `torch.multiprocessing.spawn` in the
tests (`init(rank, world, ...)`, gloo on CPU). `shard_model` applies torch.distributed.fsdp.fully_shard (FSDP2)
as torchtitan does: one FSDP unit per decoder block (the last block not resharded after forward: backward needs
it first), then the root (embeddings, final norm, LM head; tied embeddings stay in one unit). Parameters become
DTensors sharded on dim 0, so an optimizer built after `shard_model` keeps its AdamW moments sharded too (AdamW is
elementwise: each rank updates its own shard with the single-process arithmetic). No MixedPrecisionPolicy:
the fp32 master is what every profile casts or quantizes from (nn.linear caches those operands per weight
version), so FSDP gathers fp32 and the profile decides the rest. FSDP2 runs on CPU/gloo in torch 2.13 as is;
the one gloo limit met: a gradient divide factor of 1.0 makes FSDP reduce with ReduceOp.PREMUL_SUM, which gloo
refuses ("Cannot use ReduceOp.PREMUL_SUM with Gloo"), so `shard_model` also forces plain SUM reductions.
World size 1 (the 1-GPU overhead check, bench.learner_dist) keeps FSDP2 (torch's world-1 unshard and
reduce-scatter are local copies) but drops what a group of one makes pointless: the token shard and its amax
all-reduces (`pg_step`), resharding after forward and the explicit 1.0 divide factor (`shard_model`), and
expert parallelism's all-to-alls (engines.expert_parallel); the step is then the single-process step bit for bit
(tested, with its host syncs counted equal to the plain step's).

Equality with one process (`pg_step` with dp=None vs. on each rank), on the same global batch of N rows:
- each rank takes rows [r·N/R, (r+1)·N/R), padded to the GLOBAL padded length L (pads are real embeddings and
  enter per-tensor amaxes, engines.batching), and the loss is the global token mean (divided by the global
  token count; FSDP's reduce-scatter sums, its 1/R divide is switched off);
- the NVFP4 GEMMs run inside `nn.shard.token_shard`: dynamic per-tensor amaxes of token operands are all-reduced
  (max) — te-nvfp4: forward activations, dgrad dy, wgrad xᵀ and dyᵀ (after RHT); minite: dgrad dy and wgrad
  xᵀ/dyᵀ (its activations are per token, its weights full on every rank) — and stochastic rounding draws at
  global token coordinates. Codes and scales of every operand are then the single-process ones bit for bit
  (needs each rank's token count N/R·L to be a multiple of 16: the wgrad's 16-token blocks stay on one rank);
- what is NOT bitwise: a weight gradient is the sum of R partial wgrad GEMMs (fp32 accumulation in another
  order, and under bf16 each partial is rounded to bf16 before the sum, as the bf16 profile's dW is emitted in
  bf16), so gradients agree within the dW dtype's rounding (tests name the tolerance); the updated weights are
  exactly one-process AdamW applied to those gradients (Adam's g/(|g| + eps) can magnify a rounding-level
  gradient difference up to lr where |g| ~ eps, so weights are not compared to the reference's by tolerance).
  Per-token log-probs are bitwise wherever the CPU GEMM's result for a row does not depend on how many rows
  it multiplies (tested).
MoE layers: call `engines.expert_parallel.install` before `shard_model` — experts split over the ranks, tokens
dispatched with all-to-all, every expert's GEMMs on one rank over exactly its single-process rows (bitwise expert
gradients); those weights stay out of FSDP. Without it, NVFP4 expert GEMMs on a token shard refuse to run
(nn.experts: per-expert amaxes and 16-token wgrad blocks would span ranks).
On GPU the same holds: the Triton quantizers take the shard's SR origin (kernels.quantize, kernels.quantize_cols)
and the grouped Triton path an expert-parallel rank's expert offset (nn.experts), both tested bitwise under the
interpreter.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minite_core.engines.learner import Learner
from minite_core.nn.shard import TokenShard, token_shard


@dataclass(frozen=True)
class DataParallel:
    """One rank's view of the data-parallel group (the default group; amaxes on a group of their own, so they
    never queue behind FSDP's all-gathers and reduce-scatters)."""

    rank: int
    world: int
    amax_group: object

    def reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        out = t.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.amax_group)
        return out

    def rows(self, n: int) -> slice:
        """This rank's contiguous slice of n global rows."""
        if n % self.world:
            raise ValueError(f"a global batch of {n} rows does not split over {self.world} ranks; use a multiple")
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)


def init(rank: int, world: int, *, backend: str = "gloo", init_method: str | None = None) -> DataParallel:
    """Join (or create) the process group; `init_method` e.g. "tcp://127.0.0.1:29500" (None: env:// as torchrun
    sets it)."""
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, init_method=init_method)
    return DataParallel(rank=dist.get_rank(), world=dist.get_world_size(), amax_group=dist.new_group())


def init_from_env() -> DataParallel:
    """Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): NCCL on GPUs, gloo on CPU."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"not launched by torchrun ({', '.join(missing)} unset): run "
                         "`torchrun --nproc-per-node N ...`")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return init(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), backend=backend)


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 in place: one unit per decoder block, then the root; gradients summed (not averaged) over ranks,
    because `pg_step` already divides by the global token count."""
    from torch.distributed.fsdp import fully_shard

    from minite_core.engines.expert_parallel import expert_params

    ignored = expert_params(model) or None  # experts of expert parallelism stay whole on their owner
    layers = list(model.model.layers)
    one = dist.get_world_size() == 1
    for i, block in enumerate(layers):
        # one rank: the "sharded" block is the whole block, so resharding after forward frees nothing for good
        # and only makes backward copy it in again
        fully_shard(block, reshard_after_forward=not one and i < len(layers) - 1, ignored_params=ignored)
    fully_shard(model, ignored_params=ignored)
    for unit in (*layers, model):
        if not one:  # one rank: FSDP's default divide (by world size 1) is none; a 1.0 factor adds a /1.0 pass
            unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM (the 1.0 factor's op)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded DTensor (a collective: every rank calls it), a plain tensor unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def param_groups(model: torch.nn.Module) -> list[dict]:
    """The optimizer's parameter groups: FSDP's DTensor shards, then plain tensors (expert parallelism's whole
    experts). A foreach or fused AdamW step refuses DTensors and plain tensors in one group (met on the H200)."""
    params = list(model.parameters())
    groups = ([p for p in params if hasattr(p, "full_tensor")], [p for p in params if not hasattr(p, "full_tensor")])
    return [{"params": g} for g in groups if g]


@dataclass
class StepOut:
    loss: torch.Tensor  # fp32 [] this rank's part of the global loss (sums to it over ranks)
    logp: torch.Tensor  # (n, T) this rank's rows' response log-probs (masked positions hold junk)
    mask: torch.Tensor  # (n, T) bool


def pg_step(learner: Learner, opt: torch.optim.Optimizer, prompt_ids, response_ids, adv: torch.Tensor, *,
            dp: DataParallel | None = None) -> StepOut:
    """One policy-gradient learner step on the global batch: loss = −Σ_i,t adv_i·logπ(y_i,t) / (global response
    tokens) (GRPO's token-mean surrogate at ratio 1, the first update of an RL step), backward, `opt.step()`.
    dp=None: the single-process reference; else this rank's rows (DataParallel.rows) on a sharded model.
    adv: (N,) global advantages. The caller sets `learner.set_step` (SR seeds) as in one process."""
    N = len(prompt_ids)
    rows = dp.rows(N) if dp is not None else slice(0, N)
    L = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
    n_tok = sum(len(r) for r in response_ids)  # global, from the host lists: no collective
    shard = None
    if dp is not None and dp.world > 1:  # one rank's shard is the whole batch: offset 0, the max over a group of
        # one is the identity, so the quantizers' own amaxes are the global ones (no all-reduce, no extra amax pass)
        shard = token_shard(TokenShard(offset=rows.start * L, reduce_max=dp.reduce_max))
    learner.pad_length = L
    try:
        with shard or contextlib.nullcontext():
            logp, _, mask = learner.logprobs(prompt_ids[rows], response_ids[rows], grad=True)  # (n, T)
            a = adv[rows].to(logp.device)[:, None]  # (n, 1)
            loss = -torch.where(mask, a * logp, torch.zeros_like(logp)).sum() / n_tok
            opt.zero_grad(set_to_none=True)
            loss.backward()
    finally:
        learner.pad_length = None
    opt.step()
    return StepOut(loss=loss.detach(), logp=logp.detach(), mask=mask)
