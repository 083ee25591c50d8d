"""GRPO math as pure functions (verl ``trainer/ppo/core_algos.py`` style), with loop references.

Shape legend: B = prompts, G = group size (responses per prompt), N = B*G sequences, T = response tokens.

What and how (the recipe DESIGN.md fixes: group-normalised advantages, clip 0.2/0.28, token-mean, no KL):

- ``group_advantages``: outcome reward r_i of response i in group g -> A_i = (r_i - mean_g) / (std_g + eps), the
  std unbiased (torch.std, as verl's ``compute_grpo_outcome_advantage``); ``norm_std=False`` gives Dr.GRPO's
  A_i = r_i - mean_g. A group whose rewards are all equal has A = 0 (no signal). Deliberate difference from verl:
  group_size < 2 raises instead of passing raw rewards through (GRPO without a group has no baseline).
- ``policy_loss``: PPO clipped surrogate with decoupled clip range (DAPO "clip-higher"), per token t of sequence i:
      rho = exp(clamp(logp_new - logp_old, -20, 20))                        (verl clamps the log-ratio at ±20)
      l   = max(-A * rho, -A * clamp(rho, 1 - clip_low, 1 + clip_high))
  optionally dual clip (verl ``clip_ratio_c``, off by default): for A < 0, l = min(l, -A * clip_ratio_c).
  ``logp_old`` is the learner's recompute of the behaviour policy at the start of the step; ``logp_old``,
  ``logp_sampler`` and ``advantages`` are constants (detached here).
- Rollout correction (the sampler's numerics are not the learner's; DESIGN.md's thesis), with the per-token
  sampler/learner ratio  w_t = exp(logp_old - logp_sampler)  (log-ratio clamped at ±20):
  * ``"tis"``  truncated importance sampling: l_t <- l_t * min(w_t, cap), the weight detached.
    Ref: F. Yao, L. Liu et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025
    blog; C = 2); verl ``rollout_is`` token mode.
  * ``"mis-token"`` masked importance sampling, token level: drop token t from the loss (mask and denominator)
    when w_t is outside [1/cap, cap], compared in log space: |log w_t| > log(cap).
  * ``"mis-seq"`` sequence level: drop the whole sequence when its geometric-mean ratio
    exp(mean_t log w_t) is outside [1/cap, cap]  (verl's "geometric" rejection mode; J. Liu, Y. Li et al.,
    "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch", 2025).
  The MIS variants here reject only; they do not also reweight the kept tokens.
- ``aggregate`` (verl ``agg_loss``): "token-mean" = sum(l*m) / sum(m); "seq-mean-token-sum" = mean over sequences
  of sum_t l*m; "seq-mean-token-mean" = mean over sequences of (sum_t l*m / sum_t m). Fully masked sequences do not
  count in the sequence modes. ``denom`` overrides the denominator (token or sequence count of the whole global
  batch) so that summing micro-batch losses reproduces the full-batch loss under gradient accumulation.

Masked positions may hold any finite value; they are excluded with ``torch.where`` (not multiplication), so an inf
there does not leak into the loss. Metrics are detached 0-dim tensors (no host sync here; call ``float(v)`` when
logging), computed over the tokens that stay in the loss (after MIS rejection) unless named otherwise.

Every function has a ``*_ref`` twin below written as plain Python loops over sequences and tokens; tests check the
vectorised version equals the reference (values, metrics and gradients) on random inputs.
"""
from __future__ import annotations

import math

import torch

from minite_core.engines.mismatch import LOG_RATIO_CLAMP, clamped_log_ratio

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
CORRECTIONS = (None, "tis", "mis-token", "mis-seq")


def parse_correction(name: str | None) -> str | None:
    """"none" / "" / None -> None; a known correction name -> itself; else ValueError naming the choices."""
    c = None if name in (None, "", "none") else name
    if c not in CORRECTIONS:
        raise ValueError(f"unknown correction {name!r}; known: none, {', '.join(CORRECTIONS[1:])}")
    return c


def run_name(learner: str, sampler: str, correction: str | None, seed: int | None = None) -> str:
    """``{learner}__{sampler}__{correction}`` (correction "none" when off), + ``__s{seed}`` when a run seed other
    than the experiment's is named: the results directory of the run."""
    return f"{learner}__{sampler}__{correction or 'none'}" + ("" if seed is None else f"__s{seed}")


# ----------------------------------------------------------------------------------------------- vectorised
def group_advantages(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-6, norm_std: bool = True
) -> torch.Tensor:
    """rewards (N,) with N = B*G, groups contiguous -> advantages (N,)."""
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards {tuple(rewards.shape)} must be 1-D with length a multiple of group_size >= 2 "
                         f"(got group_size={group_size})")
    r = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)  # (B, G)
    adv = r - r.mean(dim=-1, keepdim=True)
    if norm_std:
        adv = adv / (r.std(dim=-1, keepdim=True) + eps)
    return adv.reshape(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask (bool); 0 when the mask is empty."""
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def masked_mean_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of x (N, T) over mask (N, T) bool -> (N,); 0 for an empty row."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *, denom: float | None = None
) -> torch.Tensor:
    """loss_mat (N, T), mask (N, T) bool/0-1 -> scalar loss."""
    m = mask.bool()
    lm = torch.where(m, loss_mat, torch.zeros_like(loss_mat))  # (N, T)
    if mode == "token-mean":
        return lm.sum() / (denom if denom is not None else m.sum().clamp(min=1))
    n_tok = m.sum(dim=-1)  # (N,)
    if mode == "seq-mean-token-sum":
        seq = lm.sum(dim=-1)
    elif mode == "seq-mean-token-mean":
        seq = lm.sum(dim=-1) / n_tok.clamp(min=1)
    else:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {AGG_MODES}")
    n_seq = (n_tok > 0).sum().clamp(min=1)
    return seq.sum() / (denom if denom is not None else n_seq)  # fully masked rows contribute 0 to the sum


def rollout_correction(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor, mode: str, cap: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """-> (weight (N, T) detached, kept mask (N, T) bool, metrics). See the module docstring for the formulas."""
    if mode not in CORRECTIONS[1:]:
        raise ValueError(f"unknown correction {mode!r}; known: {CORRECTIONS}")
    if cap <= 1.0:
        raise ValueError(f"cap must be > 1, got {cap}")
    m = mask.bool()
    log_w = clamped_log_ratio(logp_old.detach(), logp_sampler.detach())  # (N, T)
    log_cap = math.log(cap)
    metrics: dict[str, torch.Tensor] = {}
    if mode == "tis":
        weight = log_w.exp().clamp(max=cap)
        metrics["actor/tis_weight_mean"] = masked_mean(weight, m)
        metrics["actor/tis_clip_frac"] = masked_mean((log_w > log_cap).to(log_w.dtype), m)
        return weight, m, metrics
    if mode == "mis-token":
        keep = m & (log_w.abs() <= log_cap)
    else:  # mis-seq: geometric-mean ratio per sequence
        seq_log_w = masked_mean_rows(log_w, m)  # (N,)
        seq_keep = seq_log_w.abs() <= log_cap
        keep = m & seq_keep[:, None]
        has_tok = m.any(dim=-1)
        metrics["actor/mis_seq_reject_frac"] = ((~seq_keep) & has_tok).sum() / has_tok.sum().clamp(min=1)
    metrics["actor/mis_reject_frac"] = (m & ~keep).sum() / m.sum().clamp(min=1)
    return torch.ones_like(log_w), keep, metrics


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    *,
    correction: str | None = None,
    logp_sampler: torch.Tensor | None = None,
    cap: float = 2.0,
    clip_ratio_c: float | None = None,
    agg_mode: str = "token-mean",
    denom: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """logp_* (N, T), advantages (N,), mask (N, T) -> (scalar loss, metrics). Gradient flows into logp_new only."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; known: {CORRECTIONS}")
    if correction is not None and logp_sampler is None:
        raise ValueError(f"correction={correction!r} needs logp_sampler")
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    m = mask.bool()
    weight, metrics = None, {}
    if correction is not None:
        weight, m, metrics = rollout_correction(logp_old, logp_sampler, m, correction, cap)
    adv = advantages.detach().to(logp_new.dtype)[:, None]  # (N, 1)
    log_ratio = clamped_log_ratio(logp_new, logp_old.detach())  # (N, T)
    ratio = log_ratio.exp()
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    if clip_ratio_c is not None:
        pg3 = -adv * clip_ratio_c
        dual = (adv < 0) & (pg > pg3)
        metrics["actor/clipfrac_dual"] = masked_mean(dual.to(pg.dtype), m)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
    if correction == "tis":
        pg = pg * weight
    loss = aggregate(pg, m, agg_mode, denom=denom)
    f = lambda b: masked_mean(b.to(pg.dtype), m)  # noqa: E731
    metrics.update({
        "actor/pg_loss": loss.detach(),
        "actor/clipfrac": f(clipped),
        "actor/clipfrac_high": f(clipped & (adv > 0)),
        "actor/clipfrac_low": f(clipped & (adv < 0)),
        "actor/ppo_kl": masked_mean(-log_ratio.detach(), m),  # k1 estimate of KL(old || new), as verl logs it
        "actor/ratio_mean": masked_mean(ratio.detach(), m),
    })
    return loss, metrics


# ----------------------------------------------------------------------------------------------- loop references
def group_advantages_ref(rewards, group_size: int, eps: float = 1e-6, norm_std: bool = True) -> list[float]:
    r = [float(x) for x in rewards]
    out = []
    for g in range(0, len(r), group_size):
        grp = r[g:g + group_size]
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (len(grp) - 1))
        out += [(x - mean) / (std + eps) if norm_std else x - mean for x in grp]
    return out


def aggregate_ref(loss_mat, mask, mode: str = "token-mean", *, denom: float | None = None):
    """Loops over rows and tokens; works on torch 0-dim elements (so autograd flows) or floats."""
    total, n_tok, n_seq = 0.0, 0, 0
    for i in range(len(loss_mat)):
        row, cnt = 0.0, 0
        for t in range(len(loss_mat[i])):
            if bool(mask[i][t]):
                row = row + loss_mat[i][t]
                cnt += 1
        n_tok += cnt
        n_seq += cnt > 0
        if mode == "token-mean" or mode == "seq-mean-token-sum":
            total = total + row
        elif mode == "seq-mean-token-mean":
            total = total + (row / cnt if cnt else 0.0)
        else:
            raise ValueError(mode)
    d = denom if denom is not None else max(n_tok if mode == "token-mean" else n_seq, 1)
    return total / d


def policy_loss_ref(
    logp_new, logp_old, advantages, mask, clip_low=0.2, clip_high=0.28, *, correction=None, logp_sampler=None,
    cap=2.0, clip_ratio_c=None, agg_mode="token-mean", denom=None,
):
    """Token-by-token loop over the same formulas; returns (loss 0-dim tensor, metrics as floats)."""
    N, T = len(logp_new), len(logp_new[0])
    clamp = lambda v: max(-LOG_RATIO_CLAMP, min(LOG_RATIO_CLAMP, v))  # noqa: E731
    keep = [[bool(mask[i][t]) for t in range(T)] for i in range(N)]
    weight = [[1.0] * T for _ in range(N)]
    met: dict[str, float] = {}
    if correction is not None:
        n_in = sum(map(sum, keep))
        log_w = [[clamp(float(logp_old[i][t]) - float(logp_sampler[i][t])) for t in range(T)] for i in range(N)]
        if correction == "tis":
            ws, n_trunc = [], 0
            for i in range(N):
                for t in range(T):
                    weight[i][t] = min(math.exp(log_w[i][t]), cap)
                    if keep[i][t]:
                        ws.append(weight[i][t])
                        n_trunc += log_w[i][t] > math.log(cap)
            met["actor/tis_weight_mean"] = sum(ws) / max(len(ws), 1)
            met["actor/tis_clip_frac"] = n_trunc / max(len(ws), 1)
        elif correction == "mis-token":
            keep = [[keep[i][t] and abs(log_w[i][t]) <= math.log(cap) for t in range(T)] for i in range(N)]
        elif correction == "mis-seq":
            n_rej, n_has = 0, 0
            for i in range(N):
                vals = [log_w[i][t] for t in range(T) if keep[i][t]]
                if not vals:
                    continue
                n_has += 1
                if abs(sum(vals) / len(vals)) > math.log(cap):
                    keep[i] = [False] * T
                    n_rej += 1
            met["actor/mis_seq_reject_frac"] = n_rej / max(n_has, 1)
        else:
            raise ValueError(correction)
        if correction != "tis":
            met["actor/mis_reject_frac"] = (n_in - sum(map(sum, keep))) / max(n_in, 1)
    loss_mat = [[None] * T for _ in range(N)]
    counts = {"clip": 0, "high": 0, "low": 0, "dual": 0}
    kl, rsum, n = 0.0, 0.0, 0
    for i in range(N):
        a = float(advantages[i])
        for t in range(T):
            ratio = torch.exp((logp_new[i][t] - float(logp_old[i][t])).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            l1 = -a * ratio
            l2 = -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
            l = torch.maximum(l1, l2)
            is_clip = bool(l2 > l1)
            if clip_ratio_c is not None and a < 0:
                is_dual = bool(l > -a * clip_ratio_c)
                l = torch.minimum(l, torch.tensor(-a * clip_ratio_c, dtype=l.dtype))
            else:
                is_dual = False
            loss_mat[i][t] = l * weight[i][t]
            if keep[i][t]:
                n += 1
                counts["clip"] += is_clip
                counts["high"] += is_clip and a > 0
                counts["low"] += is_clip and a < 0
                counts["dual"] += is_dual
                kl += -math.log(ratio.item())
                rsum += ratio.item()
    loss = aggregate_ref(loss_mat, keep, agg_mode, denom=denom)
    loss = loss if torch.is_tensor(loss) else torch.tensor(float(loss))
    d = max(n, 1)
    met.update({"actor/pg_loss": loss.item(), "actor/clipfrac": counts["clip"] / d,
                "actor/clipfrac_high": counts["high"] / d, "actor/clipfrac_low": counts["low"] / d,
                "actor/ppo_kl": kl / d, "actor/ratio_mean": rsum / d})
    if clip_ratio_c is not None:
        met["actor/clipfrac_dual"] = counts["dual"] / d
    return loss, met
