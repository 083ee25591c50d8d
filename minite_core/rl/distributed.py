"""`minite rl` on R ranks (`torchrun --nproc-per-node R -m minite_core.cli rl ...`): the GRPO loop of rl/train.py
with its learner side on the scale-out learner (engines.distributed: FSDP2 + data parallelism; MoE layers expert
parallel, engines.expert_parallel), and the single-process numerics.

Shape legend: N = responses per step, n = N / mini_batches rows per mini-batch, R = ranks, L = padded length.

Two copies of the weights on every rank, as verl keeps the rollout engine's weights beside the trainer's:
- the SAMPLER copy: the plain model `_setup` built (full fp32 weights, calibrated scales). Every rank samples
  the WHOLE step on it — the same prompts, seeds and code as one process — so rollouts, rewards and advantages
  are the single-process ones by construction, with no collective inside decode (a CUDA-graph decode cannot
  hold one). Why not each rank its share of the prompts + an all-gather: a row's tokens would then depend on
  what it shares a decode batch with (dynamic per-tensor scales, M-dependent GPU GEMMs, the fast sampler's
  batch buckets) and on row-indexed seeds the sampler numbers from 0; exactness first, R-fold sampling work
  is the price (follow-up: sharded sampling once the sampler takes a row offset and batch-invariant kernels);
- the LEARNER copy: a deep copy, expert-parallel (MoE: always, so expert GEMMs see their single-process rows
  under every profile) then FSDP2-sharded, with its own AdamW (two groups: DTensor shards, whole experts).
After every update the sampler copy is refreshed from the learner (`synced`: full tensors, experts gathered).

The learner side per mini-batch slice (old log-probs, then one update each), as `engines.distributed.pg_step`
does it: rank r takes rows `DataParallel.rows(n)` of the slice, padded to the SLICE's L (learner.pad_length),
inside `token_shard(offset = first row · L)` (all-reduced amaxes, SR at global coordinates). Old log-probs,
entropies, argmaxes and each update's new log-probs (detached) are all-gathered, so every rank holds the
slice's full tensors: the mismatch metrics and policy_loss's metrics are computed on them exactly as one process
computes them. The loss a rank backpropagates is policy_loss over its rows with `denom` = the slice's global
kept-token count (token-mean; MIS rejections counted on the full slice), FSDP sums the partial gradients. Grad
clipping: the global norm from every rank's local shards (sum of squares, all-reduced), then clip_grad_norm_'s
coefficient. What is bitwise vs one process: rollouts, rewards, old log-probs and mismatch metrics of a step
whose weights are equal (step 1), and the first mini-batch's actor metrics; gradients agree within the dW
dtype's rounding (engines.distributed), so later weights, and everything computed from them, agree only
that closely. NVFP4 learners with a quantized backward need every rank's tokens n/R·L a multiple of 16 (the
wgrad's 16-token blocks, nn.shard); L is random, so n/R itself must be a multiple of 16 (checked at start).

State: rank 0 writes runs/state.py's one-process `state.pt` (the sampler copy's full weights, and the AdamW
moments gathered into a never-stepped AdamW on that copy: the one-process layout; the config records `ranks`,
so a state resumes only on the world size that wrote it, since the gradient sums' order is part of the numerics),
the step log, the evaluations (greedy held-out, on the sampler copy) and the outputs. Resume: rank 0 runs
runs/state.resume (checks, stale state, log truncation), the step is broadcast, the other ranks read the same
file, and every rank scatters the full tensors into its shards.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os

import torch
import torch.distributed as dist

from minite_core.engines import distributed as D
from minite_core.engines import expert_parallel as EP
from minite_core.engines.learner import Learner
from minite_core.nn import track_optimizer
from minite_core.nn.nonfinite import NonFinite, Watch
from minite_core.nn.operands import clear_weight_caches
from minite_core.nn.shard import TokenShard, token_shard
from minite_core.rl.grpo import policy_loss, rollout_correction
from minite_core.rl.learner_side import OneProcess, pad_cols, step_and_log
from minite_core.runs.state import load_state


def join() -> D.DataParallel | None:
    """The data-parallel group of this run: a process group already joined (the tests' spawned ranks), or
    torchrun's (WORLD_SIZE > 1); None for one process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return D.init(dist.get_rank(), dist.get_world_size())
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return D.init_from_env()
    return None


class _NoLog:
    """The step log of a rank that does not write one."""

    def append(self, row):
        pass


class DataParallelSide(OneProcess):
    """The learner side of one rank (the module docstring); rl.learner_side.OneProcess's interface."""

    def __init__(self, run, dp: D.DataParallel):
        cfg, profile = run.cfg, run.learner.profile
        n = cfg.prompts_per_step * cfg.group_size // cfg.mini_batches
        if n % dp.world:
            raise ValueError(f"rl: {n} rows per mini-batch do not split over {dp.world} ranks; make "
                             "prompts_per_step*group_size/mini_batches a multiple of the world size")
        if profile.quantized and profile.grad is not None and (n // dp.world) % 16:
            raise ValueError(f"rl: learner {profile.name!r} on {dp.world} ranks has {n // dp.world} rows per rank "
                             "and mini-batch; its NVFP4 wgrad needs a multiple of 16 (prompts_per_step*group_size/"
                             "mini_batches/ranks), or run it on one process")
        self.dp, self.main = dp, dp.rank == 0
        self.shadow = self.state_opt = run.opt  # AdamW on the sampler copy, never stepped: state.pt's layout
        model = copy.deepcopy(run.sampler.model)
        EP.install(model, dp.rank, dp.world)  # no-op without MoE layers
        D.shard_model(model)
        self.experts = EP.expert_params(model)
        opt = torch.optim.AdamW(D.param_groups(model), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        track_optimizer(opt, model)
        self.pairs = list(zip(model.named_parameters(), run.sampler.model.named_parameters()))
        bad = [a for (a, _), (b, _) in self.pairs if a != b]
        if bad:
            raise RuntimeError(f"sharded and sampler models name their parameters differently: {bad[:3]}")
        self.pairs = [(p, q) for (_, p), (_, q) in self.pairs]
        # the world size is part of the numerics (how gradients are summed): a state resumes on the same one only
        self.run = dataclasses.replace(run, learner=Learner(model, profile, seed=run.learner.seed), opt=opt,
                                       run_cfg={**run.run_cfg, "ranks": dp.world})

    # ---- full <-> sharded ---------------------------------------------------------------------------------------
    def _full(self, t: torch.Tensor, p) -> torch.Tensor:
        """The whole tensor of parameter p's (or its optimizer state's) local part t (a collective)."""
        if p not in self.experts:
            return D.full(t)
        parts = [torch.empty_like(t) for _ in range(self.dp.world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)  # experts in rank order: the full [E, ...] weight

    def _local(self, full: torch.Tensor, p):
        """This rank's part of a full tensor, shaped (and placed) like parameter p (no communication)."""
        from torch.distributed.tensor import distribute_tensor

        full = full.to(p.device)
        if p in self.experts:
            k = p.shape[0]
            return full[self.dp.rank * k:(self.dp.rank + 1) * k].clone()
        if hasattr(p, "device_mesh"):
            return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
        return full.clone()

    def synced(self) -> None:
        with torch.no_grad():
            for p, q in self.pairs:
                q.copy_(self._full(p.detach(), p))
        clear_weight_caches(self.run.sampler.model)

    # ---- state ----------------------------------------------------------------------------------------------------
    def lock(self, state_dir):
        return super().lock(state_dir) if self.main else contextlib.nullcontext()

    def save(self, state_dir, step: int, extra: dict) -> None:
        opt = self.run.opt
        for p, q in self.pairs:
            st = opt.state[p]
            self.shadow.state[q] = {"step": st["step"].clone(), **{k: self._full(st[k], p)
                                                                   for k in ("exp_avg", "exp_avg_sq")}}
        if self.main:
            super().save(state_dir, step, extra)  # the sampler copy already holds this step's weights (`synced`)
        self.shadow.state.clear()
        dist.barrier()

    def resume(self, state_dir, restart: bool, on_change: str = "error", out=None):
        run, log = self.run, _NoLog()
        head = [0, {}]
        if self.main:
            step, extra, log = super().resume(state_dir, restart, on_change, out)
            head = [step, extra]
        dist.broadcast_object_list(head, src=0)
        step, extra = head
        if step and not self.main:  # rank 0 has checked (and kept) the file; the others read it
            load_state(state_dir, model=run.sampler.model, optimizer=self.shadow, config=run.run_cfg)
        if step:
            self._scatter()
        return step, extra, log

    def _scatter(self) -> None:
        """Weights, AdamW state and calibrated scales of the sampler copy (just loaded) into the learner's shards."""
        opt, model = self.run.opt, self.run.learner.model
        with torch.no_grad():
            for p, q in self.pairs:
                p.copy_(self._local(q.detach(), p))
                st = self.shadow.state[q]
                opt.state[p] = {"step": st["step"].clone(),
                                **{k: self._local(st[k], p) for k in ("exp_avg", "exp_avg_sq")}}
        for name, m in self.run.sampler.model.named_modules():
            if getattr(m, "input_amax", None) is not None:
                model.get_submodule(name).input_amax = m.input_amax.clone()
        self.shadow.state.clear()
        clear_weight_caches(model)

    def share(self, metrics):
        box = [metrics]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ---- the learner side of a step (rl_step's items 4 and 5) -------------------------------------------------
    def _rows(self, sl: slice) -> slice:
        """This rank's rows of the mini-batch slice sl, as global row indices."""
        mine = self.dp.rows(sl.stop - sl.start)
        return slice(sl.start + mine.start, sl.start + mine.stop)

    @contextlib.contextmanager
    def _shard(self, learner, prompts, response_ids, sl: slice):
        """Forward (and backward) this rank's rows of slice sl as a token shard of the slice's batch."""
        L = max(len(prompts[i]) + len(response_ids[i]) for i in range(sl.start, sl.stop))
        learner.pad_length = L
        try:
            with token_shard(TokenShard(offset=(self._rows(sl).start - sl.start) * L,
                                        reduce_max=self.dp.reduce_max)):
                yield
        finally:
            learner.pad_length = None

    def _gather(self, t: torch.Tensor, T: int) -> torch.Tensor:
        """(n/R, T_r) of every rank -> (n, T), rank order (bool travels as uint8: gloo has no bool)."""
        x = pad_cols(t.to(torch.uint8) if t.dtype == torch.bool else t, T).contiguous()
        parts = [torch.empty_like(x) for _ in range(self.dp.world)]
        dist.all_gather(parts, x)
        out = torch.cat(parts)
        return out.bool() if t.dtype == torch.bool else out

    def old_logprobs(self, learner, prompts, response_ids, slices, cfg, routes) -> list[tuple]:
        out = []
        with torch.no_grad():
            for sl in slices:
                rows = self._rows(sl)
                with self._shard(learner, prompts, response_ids, sl):
                    parts = learner.logprobs(prompts[rows], response_ids[rows], temperature=cfg.temperature,
                                             top_p=cfg.top_p, with_entropy=True, with_argmax=True,
                                             routes=routes(rows))
                T = max(len(r) for r in response_ids[sl])
                out.append(tuple(self._gather(t, T) for t in parts))
        return out

    def _check(self, watch: Watch, where: str) -> None:
        """`Watch.check` on every rank at once: a non-finite operand on any rank stops all of them before the
        optimizer step, each raising the lowest bad rank's message (the layer it saw) and the list of bad ranks
        (expert parallelism carries one rank's non-finite tokens into the others' experts)."""
        try:
            watch.check(where)
            seen = None
        except NonFinite as e:
            seen = str(e)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([seen is not None], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one small collective a mini-batch, beside the norm's
        if flag.item():
            seen_by = [None] * self.dp.world
            dist.all_gather_object(seen_by, seen)
            bad = [r for r, m in enumerate(seen_by) if m is not None]
            raise NonFinite(f"{seen_by[bad[0]]} (rank {bad[0]}; ranks that saw non-finite values: {bad})")

    def _clip(self, model, max_norm: float) -> float:
        """clip_grad_norm_ over the sharded model: the global 2-norm from every rank's shards -> its value."""
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for p in model.parameters() if p.grad is not None]
        sq = torch.stack([g.float().pow(2).sum() for g in grads]).sum()
        dist.all_reduce(sq)  # every element lives on one rank: FSDP shards, expert slices
        norm = sq.sqrt()
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # torch.nn.utils.clip_grad_norm_'s coefficient
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return float(norm)

    def update(self, step, cfg, model, learner, opt, prompts, response_ids, slices, logp_old, adv, mask,
               logp_sampler, correction, routes):
        model.train()
        actor: dict[str, list[float]] = {}
        grad_norms = []
        watch = Watch(model)  # this rank's non-finite activations / gradients, named by layer (nn/nonfinite.py)
        for k, sl in enumerate(slices):
            learner.set_step(step * cfg.mini_batches + k)
            rows = self._rows(sl)
            T = max(len(r) for r in response_ids[sl])  # the slice's longest response (one process's T)
            keep = mask[sl, :T]
            if correction is not None:  # the slice's kept tokens, as one process's denominator counts them
                keep = rollout_correction(logp_old[sl, :T], logp_sampler[sl, :T], keep, correction,
                                          cfg.correction_cap)[1]
            denom = float(keep.sum().clamp(min=1))
            with self._shard(learner, prompts, response_ids, sl), watch:
                logp_new, _, _ = learner.logprobs(prompts[rows], response_ids[rows], temperature=cfg.temperature,
                                                  top_p=cfg.top_p, grad=True, routes=routes(rows))
                Tr = logp_new.shape[1]
                loss, _ = policy_loss(logp_new, logp_old[rows, :Tr], adv[rows], mask[rows, :Tr], cfg.clip_low,
                                      cfg.clip_high, correction=correction, logp_sampler=logp_sampler[rows, :Tr],
                                      cap=cfg.correction_cap, denom=denom)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            full_new = self._gather(logp_new.detach(), T)  # the slice's metrics, as one process computes them
            loss_f, met = policy_loss(full_new, logp_old[sl, :T], adv[sl], mask[sl, :T], cfg.clip_low,
                                      cfg.clip_high, correction=correction, logp_sampler=logp_sampler[sl, :T],
                                      cap=cfg.correction_cap)
            grad_norm = self._clip(model, cfg.grad_clip)
            self._check(watch, f"rl step {step}, mini-batch {k}")
            # every rank sees the same global loss and norm: all refuse a non-finite step together
            step_and_log(step, k, opt, loss_f, grad_norm, met, grad_norms, actor)
        return grad_norms, actor
