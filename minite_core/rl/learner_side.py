"""The learner side of a GRPO step in one process (rl/train.py's items 4 and 5): the learner's old log-probs on
the update's row slices, the PPO update one optimizer step per mini-batch, and `OneProcess`, the interface the
loop drives (lock, resume, save, sync). rl/distributed.py's `DataParallelSide` is the same interface on R ranks
and shares the pieces here (`pad_cols`, `step_and_log`).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from minite_core.nn.nonfinite import Watch
from minite_core.rl.grpo import policy_loss
from minite_core.runs.lock import RunLock
from minite_core.runs.state import resume, save_state

FINAL = "final"  # the run's last checkpoint (transformers layout): what eval.smk reads as {RESULTS}/rl/{run}/final
ROLLOUTS = "rollouts"  # the run's rollout dumps (RLConfig.rollout_dump_every), NeMo-RL's layout
OUTPUTS = ("metrics.csv", "summary.json", FINAL, ROLLOUTS)  # what a run writes to --out (what --restart sets aside)


def pad_cols(t: torch.Tensor, T: int) -> torch.Tensor:
    """(n, T_chunk) -> (n, T), zero / False padded (a chunk's longest response may be shorter than the batch's)."""
    return torch.nn.functional.pad(t, (0, T - t.shape[1])) if t.shape[1] < T else t


def old_logprobs(learner, prompts, response_ids, slices, cfg, routes) -> list[tuple]:
    """Item 4: per row slice (logp, entropy, mask, argmax) of the learner under no grad."""
    with torch.no_grad():  # old log-probs on the update's own row slices: per-tensor activation scales depend
        # on which rows share a forward, so a full-batch recompute would start the PPO ratio off 1 (te-nvfp4)
        return [learner.logprobs(prompts[sl], response_ids[sl], temperature=cfg.temperature, top_p=cfg.top_p,
                                 with_entropy=True, with_argmax=True, routes=routes(sl))
                for sl in slices]


def update(step, cfg, model, learner, opt, prompts, response_ids, slices, logp_old, adv, mask, logp_sampler,
            correction, routes) -> tuple[list[float], dict[str, list[float]]]:
    """The PPO update of one RL step, one optimizer step per mini-batch slice -> (grad norms, actor metrics).
    routes(slice): the sampler's routes of those rows (replayed by an R3 learner) or None.
    Stops before an optimizer step whose loss or gradient norm is not finite."""
    model.train()
    actor: dict[str, list[float]] = {}
    grad_norms = []
    watch = Watch(model)  # non-finite activations / gradients, named by layer (nn/nonfinite.py)
    for k, sl in enumerate(slices):
        learner.set_step(step * cfg.mini_batches + k)  # update index: unique SR seeds per optimizer step
        with watch:
            logp_new, _, _ = learner.logprobs(prompts[sl], response_ids[sl], temperature=cfg.temperature,
                                              top_p=cfg.top_p, grad=True, routes=routes(sl))
            T = logp_new.shape[1]  # a chunk's longest response may be shorter than the batch's
            loss, met = policy_loss(logp_new, logp_old[sl, :T], adv[sl], mask[sl, :T], cfg.clip_low,
                                    cfg.clip_high, correction=correction, logp_sampler=logp_sampler[sl, :T],
                                    cap=cfg.correction_cap)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))  # (syncs)
        watch.check(f"rl step {step}, mini-batch {k}")  # one more sync, right behind the gradient norm's
        step_and_log(step, k, opt, loss, grad_norm, met, grad_norms, actor)
    return grad_norms, actor


def step_and_log(step, k, opt, loss, grad_norm: float, met: dict, grad_norms: list, actor: dict) -> None:
    """The end of mini-batch k's update: refuse a non-finite loss or gradient norm, else the optimizer step and
    the metrics appended."""
    loss_f = float(loss.detach())  # (synced by the metrics below anyway)
    if not (math.isfinite(grad_norm) and math.isfinite(loss_f)):
        raise ValueError(f"rl step {step}, mini-batch {k}: non-finite loss {loss_f} or gradient norm "
                         f"{grad_norm}; lower rl.lr or check the learner profile")
    opt.step()
    grad_norms.append(grad_norm)
    for key, v in met.items():
        actor.setdefault(key, []).append(float(v))


class OneProcess:
    """The learner side of a one-process run: the sampler runs the learner's module tree (weight sync is free),
    the state is runs/state.py's. rl.distributed.DataParallelSide is the same interface under torchrun."""

    main = True  # this process writes the outputs
    old_logprobs = staticmethod(old_logprobs)
    update = staticmethod(update)

    def __init__(self, run):  # rl.train._GRPO
        self.run = run
        self.state_opt = run.opt  # the optimizer whose state.pt layout the state keeps (one process: the real one)

    def lock(self, state_dir: Path):
        return RunLock(state_dir)  # one writer per run directory

    def resume(self, state_dir: Path, restart: bool, on_change: str = "error", out: Path | None = None):
        run = self.run
        state = resume(state_dir, model=run.sampler.model, optimizer=self.state_opt, config=run.run_cfg,
                       log_name="metrics.csv", restart=restart, on_change=on_change, run_dir=out, outputs=OUTPUTS,
                       result="summary.json")
        if state[0]:  # resumed weights: a sampler with its own copy takes them
            self.push()
        return state

    def save(self, state_dir: Path, step: int, extra: dict) -> None:
        save_state(state_dir, step=step, model=self.run.sampler.model, optimizer=self.state_opt,
                   config=self.run.run_cfg, extra=extra)

    def synced(self) -> None:
        """After an update: the sampler's weights are the learner's (here: the same tensors; a real vLLM engine
        holds its own copy and takes a push, peers.vllm_rollout)."""
        self.push()

    def push(self) -> None:
        """The model's weights into a sampler that holds its own copy (a vLLM engine); no-op for ours."""
        push = getattr(self.run.sampler, "push_weights", None)
        if push is not None:
            push()

    def share(self, metrics: dict) -> dict:
        return metrics
