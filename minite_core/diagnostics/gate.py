"""Mismatch budget: a k3 ceiling per engine pair that fails the diagnostics stage when exceeded; and, for logged
rollouts of any framework (`minite diagnose --rollouts`), ceilings on any metric by the name users gate on plus
SkyRL's history-relative gate (the section at the end).

What: `diagnostics.budget` in the experiment config ({"learner:sampler": k3 ceiling}) or `minite diagnose
--k3-budget X` (every measured pair) / `--k3-budget learner:sampler=X` (one pair; a pair's own value wins over
the blanket one). A pair passes when its measured mismatch/k3 <= its budget; a k3 that is nan (no token
measured) fails, since nothing was shown to be within budget. Each failing pair gives ONE line naming the pair,
the measured k3, the budget and the first divergent op of the first-divergence trace — the real pair's (sampler
in decode mode) when traced, else the profile-only one (prefill mode) — so a red CI job says where to look.

Why a gate: an RL run on a pair whose mismatch has silently grown (a kernel change, a new quantizer order)
trains off-policy without anyone noticing; k3 is the number NeMo-RL watches (healthy < 1e-3), and the trace
turns "k3 went up" into "layer 0 q_proj diverges first".
"""
from __future__ import annotations

import math

from minite_core.engines.framework_metrics import metric_key

TRACE_MODES_PREFERRED = ("decode", "prefill")  # decode = the real pair; prefill isolates the profiles


def parse_budgets(specs: list[str], pairs: list[str]) -> dict[str, float]:
    """CLI values ("X" or "learner:sampler=X") -> {pair: budget} for measured pairs; ValueError on a bad value
    or a pair that is not measured."""
    blanket, own = None, {}
    for spec in specs or []:
        pair, _, value = spec.rpartition("=")
        try:
            budget = float(value)
        except ValueError:
            raise ValueError(f"--k3-budget {spec!r}: expected X or learner:sampler=X with X a number") from None
        if not budget >= 0:
            raise ValueError(f"--k3-budget {spec!r}: the budget must be a number >= 0")
        if not pair:
            blanket = budget
        elif pair not in pairs:
            raise ValueError(f"--k3-budget {spec!r}: pair {pair!r} is not measured (pairs: {', '.join(pairs)})")
        else:
            own[pair] = budget
    if blanket is None:
        return own
    return {pair: own.get(pair, blanket) for pair in pairs}


def first_divergent_op(traces: list[dict] | None, pair: str) -> dict | None:
    """{"op", "rel_err", "sut_mode"} of the first op above the trace threshold (else the first nonzero one) in
    the pair's decode trace, else its prefill trace; None when the pair was not traced."""
    mine = {t["sut_mode"]: t for t in traces or [] if t.get("pair") == pair}
    for mode in TRACE_MODES_PREFERRED:
        t = mine.get(mode)
        if t is None:
            continue
        op = t.get("first_divergence") or t.get("first_nonzero")
        if op is None:
            return {"op": None, "rel_err": 0.0, "sut_mode": mode}  # traced: every op bitwise equal
        return {"op": op["op"], "rel_err": op["rel_err"], "sut_mode": mode}
    return None


def check_budgets(metrics: dict[str, dict], budgets: dict[str, float], traces: list[dict] | None) -> list[dict]:
    """-> one row per budgeted pair: {"pair", "k3", "k3_budget", "pass", "first_divergence"}, in `budgets`
    order."""
    rows = []
    for pair, budget in budgets.items():
        k3 = metrics[pair]["mismatch/k3"]
        rows.append({"pair": pair, "k3": k3, "k3_budget": budget, "pass": (not math.isnan(k3)) and k3 <= budget,
                     "first_divergence": first_divergent_op(traces, pair)})
    return rows


def violation_line(row: dict) -> str:
    """The one line a failing pair prints."""
    first = row["first_divergence"]
    if first is None:
        where = "first divergent op: not traced"
    elif first["op"] is None:
        where = f"first divergent op: none ({first['sut_mode']} trace bitwise equal)"
    else:
        where = f"first divergent op: {first['op']} ({first['sut_mode']} trace, rel. error {first['rel_err']:.2e})"
    return (f"mismatch budget exceeded for {row['pair']}: k3 = {row['k3']:.3e} > budget {row['k3_budget']:.3e}; "
            f"{where}")


# ---- ceilings per metric and the history-relative gate (any metric, any pair: `minite diagnose --rollouts`) ------
# A ceiling is the form NeMo-RL's CI gates in (tests/test_suites/llm/*.sh: `data["train/gen_kl_error"]["1"] <
# 0.03` for its W4A4 Qwen3-30B-A3B run). The history gate is SkyRL's (NovaSky-AI/SkyRL,
# tests/train/gpu_e2e_test/gsm8k_colocate.sh: thresholds = "5% allowance from min/max of last 10 CI runs"): the
# limit of a lower-is-better metric is max(last N runs) * (1 + tolerance), of a higher-is-better one
# min(last N runs) * (1 - tolerance). SkyRL writes those numbers into its script by hand; here they come from the
# earlier runs' result files.
HIGHER_IS_BETTER = ("mismatch/ess", "mismatch/pearson_p")
HISTORY_LAST = 10  # SkyRL's window
HISTORY_TOLERANCE = 0.05  # SkyRL's allowance


def parse_ceilings(specs: list[str], pairs: list[str]) -> dict[str, dict[str, float]]:
    """["[PAIR:]METRIC=X", ...] -> {pair: {metric key: ceiling}}; no PAIR = every pair (a pair's own wins).
    METRIC as users name it (`gen_kl_error`, `mismatch_k3_kl`, `k3`) or a result key (`rollout_corr/kl`)."""
    blanket, own = {}, {p: {} for p in pairs}
    for spec in specs or []:
        target, _, value = spec.rpartition("=")
        pair, _, metric = target.rpartition(":")
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"--ceiling {spec!r}: expected [PAIR:]METRIC=X with X a number") from None
        if not metric:
            raise ValueError(f"--ceiling {spec!r}: expected [PAIR:]METRIC=X (e.g. gen_kl_error=0.03)")
        if pair and pair not in own:
            raise ValueError(f"--ceiling {spec!r}: pair {pair!r} is not measured (pairs: {', '.join(pairs)})")
        (own[pair] if pair else blanket)[metric_key(metric)] = limit
    return {p: {**blanket, **own[p]} for p in pairs if blanket or own[p]}


def _row(pair, metric, value, limit, rule) -> dict:
    better_high = metric in HIGHER_IS_BETTER
    ok = not math.isnan(value) and (value >= limit if better_high else value <= limit)
    return {"pair": pair, "metric": metric, "value": value, "limit": limit, "rule": rule, "pass": ok}


def check_ceilings(metrics: dict[str, dict], ceilings: dict[str, dict[str, float]]) -> list[dict]:
    """One row per (pair, metric) ceiling: {"pair", "metric", "value", "limit", "rule", "pass"}; a metric the pair
    lacks is nan and fails (nothing was shown to be within its ceiling)."""
    return [_row(pair, metric, float(metrics[pair].get(metric, math.nan)), limit, "ceiling")
            for pair, own in ceilings.items() for metric, limit in own.items()]


def history_limit(values: list[float], metric: str, tolerance: float = HISTORY_TOLERANCE) -> float:
    """SkyRL's limit from earlier runs' values (section comment); nan values are skipped."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan
    return min(vals) * (1 - tolerance) if metric in HIGHER_IS_BETTER else max(vals) * (1 + tolerance)


def check_history(metrics: dict[str, dict], history: list[dict[str, dict]], gated: list[str], *,
                  last: int = HISTORY_LAST, tolerance: float = HISTORY_TOLERANCE) -> list[dict]:
    """history: earlier runs' {pair: metrics}, oldest first. One row per (pair, metric) with an earlier value in
    the last `last` runs; a pair or metric no earlier run has is not gated (nothing to be within x% of)."""
    rows = []
    for pair, mine in metrics.items():
        for metric in map(metric_key, gated):
            earlier = [float(run[pair][metric]) for run in history[-last:] if metric in run.get(pair, {})]
            limit = history_limit(earlier, metric, tolerance)
            if not math.isnan(limit):
                rule = (f"history: {'min' if metric in HIGHER_IS_BETTER else 'max'} of the last {len(earlier)} "
                        f"runs {'-' if metric in HIGHER_IS_BETTER else '+'}{tolerance:.0%}")
                rows.append(_row(pair, metric, float(mine.get(metric, math.nan)), limit, rule))
    return rows


def gate_line(row: dict) -> str:
    """The one line a failing (pair, metric) row prints."""
    op = "<" if row["metric"] in HIGHER_IS_BETTER else ">"
    return (f"mismatch gate failed for {row['pair']}: {row['metric']} = {row['value']:.3e} {op} "
            f"{row['limit']:.3e} ({row['rule']})")
