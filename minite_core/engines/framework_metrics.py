"""The learner↔sampler mismatch under the names and definitions RL frameworks log and gate on, beside ours
(engines.mismatch).

Users of NeMo-RL and verl watch their own numbers; a report that says only `mismatch/k3` makes them translate.
These functions compute each framework's metrics from the same per-token inputs as `mismatch_metrics`
(logp_learner, logp_sampler, mask: (N, T)), exactly as that framework's code defines them — formulas, the
direction of each log-ratio, where a clamp is (and is not), the `+ 1e-8` in each masked mean — but in float64 on
the given numbers (the frameworks reduce fp32 tensors; the definitions, not their roundings, are what is
reproduced).

NeMo-RL (NVIDIA-NeMo/RL, nemo_rl/algorithms/loss/loss_functions.py, `ClippedPGLossFn.__call__`; the k3 estimator
is nemo_rl/algorithms/utils.py `calculate_kl` with kl_type "k3", NeMo-RL's default, and no clamps; its masked mean
divides by the token count + 1e-8). Logged with the "train/" prefix, as NeMo-RL's CI reads them
(`data["train/gen_kl_error"]`); generation = sampler, prev = learner:
  train/gen_kl_error           mean(e^(prev−gen) − 1 − (prev−gen))      KL(P_gen ‖ P_train), k3 form
  train/policy_kl_error        mean(e^(gen−prev) − 1 − (gen−prev))      KL(P_train ‖ P_gen), k3 form
  train/token_mult_prob_error  mean(e^|gen−prev|)                       ≥ 1; 1 = identical engines
  train/js_divergence_error    mean(½·k3(prev − log M) + ½·k3(gen − log M)), log M = log(½e^prev + ½e^gen),
                               k3(d) = e^d − 1 − d: the k3 forms of KL(P_train ‖ M) and KL(P_gen ‖ M)
NeMo-RL averages each over a step's tokens (a global token count across micro-batches): here, over `mask`.

verl (verl-project/verl, verl/trainer/ppo/rollout_corr_helper.py, `compute_offpolicy_metrics`; its masked mean is
verl/utils/torch_functional.py `masked_mean`, sum / (count + 1e-8)). Logged with the "rollout_corr/" prefix (the
same kl / k3_kl were `mismatch/mismatch_kl` / `mismatch/mismatch_k3_kl` in verl's earlier mismatch_helper.py:
`METRIC_ALIASES` maps those names here); old = learner, rollout = sampler:
  rollout_corr/kl               mean(rollout − old)                     k1 of KL(π_rollout ‖ π_old)
  rollout_corr/k3_kl            mean(e^(old−rollout) − (old−rollout) − 1), no clamp
  rollout_corr/chi2_token       mean(ρ²) − 1, ρ = e^clamp(old−rollout, ±20)
  rollout_corr/chi2_seq         mean over rows of e^(2·clamp(Σ_t (old−rollout), ±20)) − 1
  rollout_corr/training_ppl     mean over rows of e^(−row mean(old));  training_log_ppl the mean of −row mean(old)
  rollout_corr/rollout_ppl      the same of the rollout log-probs;      rollout_log_ppl
  rollout_corr/log_ppl_diff     mean over rows of (row mean(rollout) − row mean(old)); _abs_diff, _diff_max, _diff_min
  rollout_corr/ppl_ratio        mean over rows of e^(row log_ppl_diff)
A row with no masked token has a row mean of 0 / 1e-8 = 0 in verl's arithmetic and still counts in the row means,
as in verl (its batches never hold such rows; a dump may).
"""
from __future__ import annotations

import math

import torch

SAFETY_BOUND = 20.0  # verl rollout_corr_helper.SAFETY_BOUND: the clamp of chi2's log-ratios
EPS = 1e-8  # the `+ 1e-8` both frameworks' masked means add to the token count
NEMO_RL = ("gen_kl_error", "policy_kl_error", "token_mult_prob_error", "js_divergence_error")
VERL = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
        "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")
KEYS = tuple(f"train/{k}" for k in NEMO_RL) + tuple(f"rollout_corr/{k}" for k in VERL)  # every key returned

# names users gate on -> the key here; NeMo-RL's CI reads "train/…", verl's earlier helper logged "mismatch/mismatch_…"
METRIC_ALIASES = {
    "gen_kl_error": "train/gen_kl_error", "policy_kl_error": "train/policy_kl_error",
    "token_mult_prob_error": "train/token_mult_prob_error", "js_divergence_error": "train/js_divergence_error",
    "mismatch_kl": "rollout_corr/kl", "mismatch/mismatch_kl": "rollout_corr/kl",
    "mismatch_k3_kl": "rollout_corr/k3_kl", "mismatch/mismatch_k3_kl": "rollout_corr/k3_kl",
    "k1": "mismatch/k1", "k3": "mismatch/k3", "kl_full_vocab": "mismatch/kl_full_vocab",
}


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Both frameworks' masked mean: sum(values where mask) / (count + 1e-8) (masked-out values never enter)."""
    m = mask.double()
    s = torch.where(mask, values, torch.zeros_like(values)).sum() if dim is None else \
        torch.where(mask, values, torch.zeros_like(values)).sum(dim)
    return s / ((m.sum() if dim is None else m.sum(dim)) + EPS)


def nemo_rl_metrics(logp_learner: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """NeMo-RL's four training↔generation metrics (module docstring) over the masked tokens; nan without one."""
    m = mask.bool()
    if not bool(m.any()):
        return {f"train/{k}": math.nan for k in NEMO_RL}
    prev, gen = logp_learner.detach().double(), logp_sampler.detach().double()
    lr = prev - gen
    log_mix = torch.log(0.5 * prev.exp() + 0.5 * gen.exp())
    k3 = lambda d: d.exp() - 1 - d  # noqa: E731 - calculate_kl's "k3" of log-ratio d
    values = (k3(lr), k3(-lr), (lr.abs() * m).exp(), 0.5 * k3(prev - log_mix) + 0.5 * k3(gen - log_mix))
    return {f"train/{k}": float(_masked_mean(v, m)) for k, v in zip(NEMO_RL, values)}


def verl_metrics(logp_learner: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's off-policy diagnostics (module docstring); nan without a masked token (verl asserts one)."""
    m = mask.bool()
    if not bool(m.any()):
        return {f"rollout_corr/{k}": math.nan for k in VERL}
    old, rollout = logp_learner.detach().double(), logp_sampler.detach().double()
    row_old, row_rollout = _masked_mean(old, m, -1), _masked_mean(rollout, m, -1)  # (N,)
    log_ratio = old - rollout
    diff = row_rollout - row_old
    log_ratio_sum = torch.where(m, log_ratio, torch.zeros_like(log_ratio)).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    out = {
        "training_ppl": (-row_old).exp().mean(), "training_log_ppl": (-row_old).mean(),
        "kl": _masked_mean(rollout - old, m), "k3_kl": _masked_mean(log_ratio.exp() - log_ratio - 1, m),
        "rollout_ppl": (-row_rollout).exp().mean(), "rollout_log_ppl": (-row_rollout).mean(),
        "log_ppl_diff": diff.mean(), "log_ppl_abs_diff": diff.abs().mean(), "log_ppl_diff_max": diff.max(),
        "log_ppl_diff_min": diff.min(), "ppl_ratio": diff.exp().mean(),
        "chi2_token": _masked_mean(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().square(), m) - 1.0,
        "chi2_seq": (2.0 * log_ratio_sum).exp().mean() - 1.0,
    }
    return {f"rollout_corr/{k}": float(out[k]) for k in VERL}


def framework_metrics(logp_learner, logp_sampler, mask) -> dict[str, float]:
    """NeMo-RL's and verl's metrics together (the keys users gate on, beside mismatch_metrics')."""
    return {**nemo_rl_metrics(logp_learner, logp_sampler, mask), **verl_metrics(logp_learner, logp_sampler, mask)}


def metric_key(name: str) -> str:
    """A metric as users name it (`gen_kl_error`, `mismatch_k3_kl`, `k3`) -> its key in the results."""
    return METRIC_ALIASES.get(name, name)


# ----------------------------------------------------------------------------------------------- references
def framework_metrics_ref(logp_learner, logp_sampler, mask) -> dict[str, float]:
    """Plain-Python loops over rows and tokens; same contract as `framework_metrics` (for the tests)."""
    rows = []
    for lp_l, lp_s, mk in zip(logp_learner.tolist(), logp_sampler.tolist(), mask.tolist()):
        rows.append([(a, b) for a, b, k in zip(lp_l, lp_s, mk) if k])
    toks = [t for r in rows for t in r]
    if not toks:
        return {k: math.nan for k in KEYS}
    n = len(toks) + EPS
    k3 = lambda d: math.exp(d) - 1 - d  # noqa: E731
    mix = lambda a, b: math.log(0.5 * math.exp(a) + 0.5 * math.exp(b))  # noqa: E731
    out = {
        "train/gen_kl_error": sum(k3(a - b) for a, b in toks) / n,
        "train/policy_kl_error": sum(k3(b - a) for a, b in toks) / n,
        "train/token_mult_prob_error": sum(math.exp(abs(b - a)) for a, b in toks) / n,
        "train/js_divergence_error": sum(0.5 * k3(a - mix(a, b)) + 0.5 * k3(b - mix(a, b)) for a, b in toks) / n,
    }
    row_old = [sum(a for a, _ in r) / (len(r) + EPS) for r in rows]
    row_rollout = [sum(b for _, b in r) / (len(r) + EPS) for r in rows]
    diff = [ro - o for o, ro in zip(row_old, row_rollout)]
    clamp = lambda x: min(max(x, -SAFETY_BOUND), SAFETY_BOUND)  # noqa: E731
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out.update({f"rollout_corr/{k}": v for k, v in {
        "training_ppl": mean([math.exp(-o) for o in row_old]), "training_log_ppl": mean([-o for o in row_old]),
        "kl": sum(b - a for a, b in toks) / n, "k3_kl": sum(math.exp(a - b) - (a - b) - 1 for a, b in toks) / n,
        "rollout_ppl": mean([math.exp(-o) for o in row_rollout]), "rollout_log_ppl": mean([-o for o in row_rollout]),
        "log_ppl_diff": mean(diff), "log_ppl_abs_diff": mean([abs(d) for d in diff]), "log_ppl_diff_max": max(diff),
        "log_ppl_diff_min": min(diff), "ppl_ratio": mean([math.exp(d) for d in diff]),
        "chi2_token": sum(math.exp(clamp(a - b)) ** 2 for a, b in toks) / n - 1.0,
        "chi2_seq": mean([math.exp(2 * clamp(sum(a - b for a, b in r))) for r in rows]) - 1.0,
    }.items()})
    return out
