"""Learner↔sampler mismatch metrics as pure functions (verl `core_algos.py` style), with loop references.

Per response token t: Δ_t = logπ_learner(y_t) − logπ_sampler(y_t) (log space, clamped to ±20 as verl clamps
log-ratios), r_t = e^Δ_t = π_learner / π_sampler. Over the masked tokens:
  mismatch/k1            mean(−Δ)                      unbiased KL(sampler ‖ learner) estimator (Schulman's k1)
  mismatch/k3            mean(r − 1 − Δ)               low-variance, always ≥ 0 (Schulman's k3; NeMo-RL's
                                                       gen_kl_error, healthy < 1e-3)
  mismatch/k3_se         std(r − 1 − Δ) / sqrt(n)      standard error of k3 over tokens (tokens of one response
                                                       are correlated: a lower bound; compare Δk3 against it)
  mismatch/abs_dp_mean   mean |p_learner − p_sampler|  of the sampled token, probability space
  mismatch/abs_dp_max    max  |p_learner − p_sampler|
  mismatch/chi2          mean(r²) − 1                  χ² divergence estimate (importance-weight variance)
  mismatch/ess           1 / mean((r / mean r)²)       normalised ESS of the token weights, in (0, 1]
  mismatch/ratio_outside_C  fraction of r outside [1/C, C] (C = 2: what MIS with cap 2 would reject)
  mismatch/pearson_p     Pearson correlation of p_learner and p_sampler (nan when either is constant)
  mismatch/argmax_flip   fraction of positions whose learner argmax token ≠ sampler argmax token
  mismatch/max_abs_delta max |Δ| over tokens (of the clamped Δ, so at most 20)
  mismatch/tokens        number of tokens measured
  mismatch/kl_full_vocab mean over tokens of KL(π_sampler ‖ π_learner) over the WHOLE vocabulary at that position
                         (only when the per-token KLs are given: `kl`, from Learner.score); k1 is its one-sample
                         estimate, so k1 ≈ kl_full_vocab up to sampling noise, and kl_full_vocab has none
The same keys per response-position bucket: `mismatch_by_position` returns one dict per bucket [lo, hi).

MoE routing agreement (`routing_agreement`), over every token both engines routed (prompt and response; the
sampler never routes the last token it samples), from the expert ids each MoE layer executed:
  routing/topk_disagree            fraction of (token, MoE layer) pairs whose top-k expert SET differs
  routing/topk_disagree/layer{i}   the same in decoder layer i
  routing/topk_disagree_any_layer  fraction of tokens whose set differs in at least one layer
  routing/first_divergent_layer    lowest decoder layer with any disagreement (None: none disagrees)
  routing/tokens                   tokens compared
A dense model has no routing: {"routing/applies": False} and None for the two headline keys, never zeros.
`minite diagnose` adds routing/replayed (the learner replays the sampler's routing, R3: its executed sets agree
by construction) and, for those pairs, routing/router_topk_disagree (what the learner's router alone would pick).

Numerics: everything in float64, k3 as expm1(Δ) − Δ — in fp32, r − 1 − Δ for |Δ| ~ 1e-4 is pure cancellation
noise (~1e-7 vs the true Δ²/2 ~ 5e-9), and aligned engines live exactly there.
"""
from __future__ import annotations

import math

import torch

LOG_RATIO_CLAMP = 20.0  # verl core_algos: exp of a log-ratio beyond ±20 is treated as ±20 (also rl.grpo's ratios)
RATIO_CAP = 2.0
# response-position buckets [lo, hi): doubling widths, since mismatch compounds along the response
POSITION_EDGES = (0, 8, 16, 32, 64, 128, 256, 512)
KEYS = ("k1", "k3", "k3_se", "abs_dp_mean", "abs_dp_max", "chi2", "ess", "ratio_outside_C", "pearson_p", "argmax_flip",
        "max_abs_delta", "tokens")
KL_KEY = "kl_full_vocab"  # present only when per-token full-vocabulary KLs are given


def clamped_log_ratio(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """logp_a − logp_b clamped to ±LOG_RATIO_CLAMP: the log importance ratio every consumer uses."""
    return (logp_a - logp_b).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def mismatch_metrics(logp_learner: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor, *,
                     argmax_learner: torch.Tensor | None = None, argmax_sampler: torch.Tensor | None = None,
                     kl: torch.Tensor | None = None, cap: float = RATIO_CAP,
                     prefix: str = "mismatch/") -> dict[str, float]:
    """logp_* (N, T) log-probs of the sampled tokens; mask (N, T) bool; argmax_* (N, T) long (optional); kl (N, T)
    per-token full-vocabulary KL (optional). -> {prefix + key: float}. No token -> every metric nan, tokens 0."""
    m = mask.bool()
    n = int(m.sum())
    out = {f"{prefix}{k}": math.nan for k in KEYS + ((KL_KEY,) if kl is not None else ())}
    out[f"{prefix}tokens"] = n
    if n == 0:
        return out
    if kl is not None:
        out[f"{prefix}{KL_KEY}"] = float(kl.detach().double()[m].mean())
    lp_l, lp_s = logp_learner.detach().double()[m], logp_sampler.detach().double()[m]  # (n,)
    delta = clamped_log_ratio(lp_l, lp_s)
    r = delta.exp()
    p_l, p_s = lp_l.exp(), lp_s.exp()
    dp = (p_l - p_s).abs()
    w = r / r.mean()
    k3_terms = torch.expm1(delta) - delta
    out.update({
        f"{prefix}k1": float((-delta).mean()),
        f"{prefix}k3": float(k3_terms.mean()),
        f"{prefix}k3_se": float(k3_terms.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan,
        f"{prefix}abs_dp_mean": float(dp.mean()),
        f"{prefix}abs_dp_max": float(dp.max()),
        f"{prefix}chi2": float((r * r).mean() - 1.0),
        f"{prefix}ess": float(1.0 / (w * w).mean()),
        f"{prefix}ratio_outside_C": float(((r < 1.0 / cap) | (r > cap)).double().mean()),
        f"{prefix}pearson_p": _pearson(p_l, p_s),
        f"{prefix}max_abs_delta": float(delta.abs().max()),
    })
    if argmax_learner is not None and argmax_sampler is not None:
        out[f"{prefix}argmax_flip"] = float((argmax_learner[m] != argmax_sampler[m]).double().mean())
    return out


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    xc, yc = x - x.mean(), y - y.mean()
    den = float((xc * xc).sum().sqrt() * (yc * yc).sum().sqrt())
    return float((xc * yc).sum()) / den if den > 0 else math.nan


def position_buckets(T: int, edges=POSITION_EDGES) -> list[tuple[int, int | None]]:
    """Fixed [lo, hi) buckets (the same for every pair, so pairs are comparable) that start before T; the
    last one is open-ended (hi None)."""
    bounds = list(zip(edges[:-1], edges[1:])) + [(edges[-1], None)]
    return [(lo, hi) for lo, hi in bounds if lo < T]


def mismatch_by_position(logp_learner, logp_sampler, mask, *, argmax_learner=None, argmax_sampler=None, kl=None,
                         edges=POSITION_EDGES, cap: float = RATIO_CAP) -> list[dict]:
    """One row per response-position bucket: {"lo", "hi" (None = open), "mismatch/<key>": ...}; empty buckets
    skipped."""
    T = mask.shape[1]
    rows = []
    for lo, hi in position_buckets(T, edges):
        sl = slice(lo, hi)  # hi None = to the end
        sub = mismatch_metrics(
            logp_learner[:, sl], logp_sampler[:, sl], mask[:, sl], cap=cap,
            argmax_learner=None if argmax_learner is None else argmax_learner[:, sl],
            argmax_sampler=None if argmax_sampler is None else argmax_sampler[:, sl],
            kl=None if kl is None else kl[:, sl])
        if sub["mismatch/tokens"]:
            rows.append({"lo": lo, "hi": hi, **sub})
    return rows


def routing_agreement(routes_learner: list[torch.Tensor] | None, routes_sampler: list[torch.Tensor] | None,
                      layers: tuple[int, ...], prefix: str = "routing/") -> dict:
    """routes_*: per row (S_i, Lm, K) executed expert ids (engines' Rollout.routes / Scores.routes; -1 = not
    routed); layers: decoder index of each of the Lm columns. -> the routing/* keys (module docstring)."""
    if not layers or routes_learner is None or routes_sampler is None:
        return {f"{prefix}applies": False, f"{prefix}topk_disagree": None, f"{prefix}first_divergent_layer": None}
    a = torch.cat([r.long() for r in routes_learner]).sort(dim=-1).values  # (n_all, Lm, K) sets as sorted ids
    b = torch.cat([r.long() for r in routes_sampler]).sort(dim=-1).values
    both = (a[..., 0] >= 0).all(-1) & (b[..., 0] >= 0).all(-1)  # (n_all,) routed by both
    differ = (a[both] != b[both]).any(dim=-1).double()  # (n, Lm)
    n = int(both.sum())
    out = {f"{prefix}applies": True, f"{prefix}tokens": n}
    per_layer = differ.mean(dim=0).tolist() if n else [math.nan] * len(layers)
    out[f"{prefix}topk_disagree"] = float(differ.mean()) if n else math.nan
    out[f"{prefix}topk_disagree_any_layer"] = float(differ.amax(dim=1).mean()) if n else math.nan
    out[f"{prefix}first_divergent_layer"] = next((i for i, v in zip(layers, per_layer) if v > 0), None)
    out.update({f"{prefix}topk_disagree/layer{i}": v for i, v in zip(layers, per_layer)})
    return out


# ----------------------------------------------------------------------------------------------- references
def mismatch_metrics_ref(logp_learner, logp_sampler, mask, *, argmax_learner=None, argmax_sampler=None, kl=None,
                         cap: float = RATIO_CAP, prefix: str = "mismatch/") -> dict[str, float]:
    """Plain-Python loop over tokens; same contract as `mismatch_metrics`."""
    deltas, pl, ps, flips, kls = [], [], [], [], []
    N, T = mask.shape
    for i in range(N):
        for t in range(T):
            if not bool(mask[i, t]):
                continue
            a, b = float(logp_learner[i, t]), float(logp_sampler[i, t])
            deltas.append(min(max(a - b, -LOG_RATIO_CLAMP), LOG_RATIO_CLAMP))
            pl.append(math.exp(a))
            ps.append(math.exp(b))
            if kl is not None:
                kls.append(float(kl[i, t]))
            if argmax_learner is not None and argmax_sampler is not None:
                flips.append(int(argmax_learner[i, t]) != int(argmax_sampler[i, t]))
    n = len(deltas)
    out = {f"{prefix}{k}": math.nan for k in KEYS + ((KL_KEY,) if kl is not None else ())}
    out[f"{prefix}tokens"] = n
    if n == 0:
        return out
    if kl is not None:
        out[f"{prefix}{KL_KEY}"] = sum(kls) / n
    r = [math.exp(d) for d in deltas]
    mean_r = sum(r) / n
    dp = [abs(a - b) for a, b in zip(pl, ps)]
    mx, my = sum(pl) / n, sum(ps) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(pl, ps))
    sxx, syy = sum((a - mx) ** 2 for a in pl), sum((b - my) ** 2 for b in ps)
    k3_terms = [math.expm1(d) - d for d in deltas]
    k3 = sum(k3_terms) / n
    out.update({
        f"{prefix}k1": sum(-d for d in deltas) / n,
        f"{prefix}k3": k3,
        f"{prefix}k3_se": math.sqrt(sum((x - k3) ** 2 for x in k3_terms) / (n - 1) / n) if n > 1 else math.nan,
        f"{prefix}abs_dp_mean": sum(dp) / n,
        f"{prefix}abs_dp_max": max(dp),
        f"{prefix}chi2": sum(x * x for x in r) / n - 1.0,
        f"{prefix}ess": 1.0 / (sum((x / mean_r) ** 2 for x in r) / n),
        f"{prefix}ratio_outside_C": sum(1 for x in r if x < 1.0 / cap or x > cap) / n,
        f"{prefix}pearson_p": sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan,
        f"{prefix}max_abs_delta": max(abs(d) for d in deltas),
    })
    if flips:
        out[f"{prefix}argmax_flip"] = sum(flips) / n
    return out


def mismatch_by_position_ref(logp_learner, logp_sampler, mask, *, argmax_learner=None, argmax_sampler=None,
                             kl=None, edges=POSITION_EDGES, cap: float = RATIO_CAP) -> list[dict]:
    """Loop reference of `mismatch_by_position`: filters tokens by position, then the loop metrics."""
    rows = []
    for lo, hi in position_buckets(mask.shape[1], edges):
        keep = torch.zeros_like(mask, dtype=torch.bool)
        keep[:, lo:hi] = mask[:, lo:hi].bool()
        sub = mismatch_metrics_ref(logp_learner, logp_sampler, keep, cap=cap, kl=kl,
                                   argmax_learner=argmax_learner, argmax_sampler=argmax_sampler)
        if sub["mismatch/tokens"]:
            rows.append({"lo": lo, "hi": hi, **sub})
    return rows


TRACE_THRESHOLD = 1e-3  # relative error at which an op "diverges" (one bf16 rounding flip is ~4e-3 per element)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖a‖ over all elements, in float64; 0 when both are 0, inf when only the reference is 0."""
    a, b = a.double(), b.double()
    d2, a2 = float(((a - b) ** 2).sum()), float((a * a).sum())
    if a2 > 0:
        return math.sqrt(d2 / a2)
    return 0.0 if d2 == 0 else math.inf


def routing_agreement_ref(routes_learner, routes_sampler, layers, prefix: str = "routing/") -> dict:
    """Loop reference of `routing_agreement`: Python sets per token and layer."""
    if not layers or routes_learner is None or routes_sampler is None:
        return {f"{prefix}applies": False, f"{prefix}topk_disagree": None, f"{prefix}first_divergent_layer": None}
    per_layer = [[] for _ in layers]
    any_layer = []
    for ra, rb in zip(routes_learner, routes_sampler):
        for a_tok, b_tok in zip(ra.tolist(), rb.tolist()):
            if min(min(ids) for ids in a_tok) < 0 or min(min(ids) for ids in b_tok) < 0:
                continue  # not routed by one of the engines
            flips = [set(a_ids) != set(b_ids) for a_ids, b_ids in zip(a_tok, b_tok)]
            for j, f in enumerate(flips):
                per_layer[j].append(f)
            any_layer.append(any(flips))
    n = len(any_layer)
    out = {f"{prefix}applies": True, f"{prefix}tokens": n}
    rates = [sum(v) / n if n else math.nan for v in per_layer]
    out[f"{prefix}topk_disagree"] = sum(map(sum, per_layer)) / (n * len(layers)) if n else math.nan
    out[f"{prefix}topk_disagree_any_layer"] = sum(any_layer) / n if n else math.nan
    out[f"{prefix}first_divergent_layer"] = next((i for i, v in zip(layers, rates) if v > 0), None)
    out.update({f"{prefix}topk_disagree/layer{i}": v for i, v in zip(layers, rates)})
    return out


def full_vocab_kl_ref(logp_p, logp_q) -> list[float]:
    """Loop reference of `engines.learner.full_vocab_kl`: per row, sum_v p_v log(p_v / q_v) in Python floats,
    after renormalising each row (math.fsum); p_v = 0 terms add 0."""
    out = []
    for row_p, row_q in zip(logp_p.tolist(), logp_q.tolist()):
        zp = math.log(math.fsum(math.exp(x) for x in row_p))
        zq = math.log(math.fsum(math.exp(x) for x in row_q))
        terms = []
        for a, b in zip(row_p, row_q):
            a, b = a - zp, b - zq
            if math.exp(a) > 0:
                terms.append(math.inf if b == -math.inf else math.exp(a) * (a - b))
        out.append(math.fsum(terms))
    return out
