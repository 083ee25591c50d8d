"""Mismatch budget: a k3 ceiling per engine pair that fails the diagnostics stage when exceeded.

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
