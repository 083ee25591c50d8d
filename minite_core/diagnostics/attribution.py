"""One-knob attribution: which execution choice makes the naive pair's mismatch.

What: start from a base pair (default: learner te-nvfp4 ↔ sampler vllm-nvfp4, the naive Blackwell stack), switch
ONE knob at a time to its value in the target profile (minite) on every side where it differs, and measure k3 of
each variant; report Δk3 = k3(variant) − k3(base), plus "all knobs" (= target↔target). A knob that removes most of
the gap is the cause; knobs whose Δk3 are small are innocent *given the others* (the effects need not add up:
knobs interact — a dominant knob masks the rest). `cumulative=True` adds the knobs one after another in the same
order, which shows what each contributes once the ones before it are aligned.

Knobs, in DESIGN.md's order (each a list of dotted Profile fields moved together):
  weight.block          weight blocks 16x16 → 1x16            (learner: TE's 2D weight tiles)
  fused_weight_scale    one weight global scale for q/k/v and for gate/up (vLLM's fused layers)
  activation.static     static (calibrated) → dynamic scale   (sampler; before scale_mode so that the cumulative
                                                               path separates the two)
  activation.scale_mode activation global scale tensor → row  (on a static side this also makes it dynamic: a
                                                               calibrated scale is per tensor — noted in the row)
  math                  fast → exact quantizer arithmetic     (weights, activations, gradients)
  router_dtype          router bf16 → fp32
  lm_head_dtype         LM head bf16 → fp32
then every other field in which either side differs from the target, found generically over the Profile /
Quant dataclass fields (wgrad_rht, grad, a missing operand such as the W4A16 sampler's activations, boundary
layers, dtype, any knob added later), so a new profile or knob needs no new code here. Backward-only fields
(grad, wgrad_rht) cannot change a forward log-prob: their variants are reported with `forward_neutral: true`
and the base pair's numbers (the memo key of `attribute` ignores them), not re-run.

`attribute(measure, ...)` is pure orchestration: `measure(learner_profile, sampler_profile) -> metrics dict` is
supplied by the caller (diagnostics.cli samples + rescores), so tests can pass a fake.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from minite_core.profiles import NON_NUMERIC, Profile, Quant, get_profile

OPERANDS = ("weight", "activation", "grad")
QUANT_FIELDS = tuple(f.name for f in dataclasses.fields(Quant))
TOP_FIELDS = tuple(f.name for f in dataclasses.fields(Profile) if f.name not in ("name",) + OPERANDS + NON_NUMERIC)
BACKWARD_ONLY = ("grad", "wgrad_rht", "wgrad_rht_dtype", "wgrad_input_scale_mode")  # read only by QuantLinear's backward


@dataclass(frozen=True)
class Knob:
    name: str
    label: str
    fields: tuple[str, ...]  # dotted Profile fields ("weight.block") or operands ("activation") or top-level


NAMED_KNOBS: tuple[Knob, ...] = (
    Knob("weight.block", "weight block 16x16 → 1x16", ("weight.block",)),
    Knob("fused_weight_scale", "fused q/k/v + gate/up weight scale", ("fused_weight_scale",)),
    Knob("activation.static", "static → dynamic activation scale", ("activation.static",)),
    Knob("activation.scale_mode", "activation scale tensor → row", ("activation.scale_mode",)),
    Knob("math", "fast → exact quantizer math", ("weight.math", "activation.math", "grad.math")),
    Knob("router_dtype", "router bf16 → fp32", ("router_dtype",)),
    Knob("lm_head_dtype", "LM head bf16 → fp32", ("lm_head_dtype",)),
)


def _all_fields(profile: Profile, target: Profile) -> list[str]:
    """Every knob field of a pair of profiles: dotted Quant fields where both have the operand, the operand name
    where only one has it, and the top-level fields."""
    out = []
    for op in OPERANDS:
        a, b = getattr(profile, op), getattr(target, op)
        if a is not None and b is not None:
            out += [f"{op}.{f}" for f in QUANT_FIELDS]
        elif (a is None) != (b is None):
            out.append(op)
    return out + list(TOP_FIELDS)


def _get(profile: Profile, field: str):
    if "." in field:
        op, attr = field.split(".", 1)
        quant = getattr(profile, op)
        return None if quant is None else getattr(quant, attr)
    return getattr(profile, field)


def align(profile: Profile, target: Profile, fields) -> tuple[Profile, dict]:
    """`profile` with `fields` set to `target`'s values where they differ -> (variant, {field: (old, new)}).
    Dotted fields of an operand that only one side has are skipped (the operand-level field moves it); an
    operand-level field moves only an operand that one side lacks."""
    changes = {}
    for field in fields:
        if "." in field:
            op = field.split(".", 1)[0]
            if getattr(profile, op) is None or getattr(target, op) is None:
                continue
        elif field in OPERANDS and (getattr(profile, field) is None) == (getattr(target, field) is None):
            continue  # operand-level knob = "quantize this operand at all"; its fields are separate knobs
        old, new = _get(profile, field), _get(target, field)
        if old != new:
            changes[field] = (old, new)
    act = profile.activation
    if changes.get("activation.scale_mode", (None, None))[1] == "row" and act is not None and act.static:
        changes["activation.static"] = (True, False)  # a per-row scale cannot be a calibrated (per-tensor) one
    if not changes:
        return profile, {}
    variant = profile.replace(**{k: new for k, (_, new) in changes.items()})
    return variant, changes


def knobs_for(learner: Profile, sampler: Profile, target: Profile) -> list[Knob]:
    """NAMED_KNOBS that move something, then one knob per remaining differing field (generic)."""
    named = {f for k in NAMED_KNOBS for f in k.fields}
    out = [k for k in NAMED_KNOBS if align(learner, target, k.fields)[1] or align(sampler, target, k.fields)[1]]
    seen = set()
    for side in (learner, sampler):
        for field in _all_fields(side, target):
            if field in named or field in seen:
                continue
            if align(side, target, (field,))[1]:
                seen.add(field)
                out.append(Knob(field, f"{field} → {target.name}'s", (field,)))
    return out


def forward_key(profile: Profile) -> Profile:
    """The forward-relevant part of a profile (name and backward-only fields blanked): equal keys = equal
    forward numerics."""
    return dataclasses.replace(profile, name="", grad=None, wgrad_rht=False, wgrad_rht_dtype="float32",
                               wgrad_input_scale_mode="tensor", **{f: False for f in NON_NUMERIC})


def attribute(measure: Callable[[Profile, Profile], dict], *, base=("te-nvfp4", "vllm-nvfp4"),
              target: str | Profile = "minite", key: str = "mismatch/k3", cache: dict | None = None,
              cumulative: bool = False) -> dict:
    """-> {"base": "l:s", "target", "key", "rows": [{"knob", "label", "learner", "sampler", "changes",
    key, "delta_k3", "forward_neutral", "metrics"}], "cumulative": [...] | None}; first row "naive" (the base
    pair), last "all knobs". `cumulative=True` also switches the knobs one after another (same order), each row
    k3 with all knobs so far (delta_k3 vs the previous row): interactions show where one-at-a-time cannot.
    `cache` maps (forward_key(l), forward_key(s)) -> metrics and is shared with the caller's pair runs."""
    learner0, sampler0 = get_profile(base[0]), get_profile(base[1])
    target = get_profile(target)
    cache = {} if cache is None else cache

    def run(lp: Profile, sp: Profile) -> dict:
        k = (forward_key(lp), forward_key(sp))
        if k not in cache:
            cache[k] = measure(lp, sp)
        return cache[k]

    def row(knob, label, lp, sp, changes):
        metrics = run(lp, sp)
        return {"knob": knob, "label": label, "learner": lp.name, "sampler": sp.name, "changes": changes,
                key: metrics[key], "forward_neutral": all(f.split(".")[0] in BACKWARD_ONLY
                                                          for side in changes.values() for f in side)
                and bool(changes), "metrics": metrics}

    def switch(lp0, sp0, knob):
        """(learner, sampler) with `knob` set to the target's value on each side it applies to, + the changes."""
        lp, lc = align(lp0, target, knob.fields)
        sp, sc = align(sp0, target, knob.fields)
        lp = lp.replace(name=f"{lp0.name}+{knob.name}") if lc else lp
        sp = sp.replace(name=f"{sp0.name}+{knob.name}") if sc else sp
        changes = {side: {f: [_jsonable(o), _jsonable(n)] for f, (o, n) in c.items()}
                   for side, c in (("learner", lc), ("sampler", sc)) if c}
        return lp, sp, changes

    rows = [row("naive", f"{learner0.name} ↔ {sampler0.name}", learner0, sampler0, {})]
    for knob in knobs_for(learner0, sampler0, target):
        rows.append(row(knob.name, knob.label, *switch(learner0, sampler0, knob)))
    rows.append(row("all", f"all knobs ({target.name} ↔ {target.name})", target, target, {}))
    k0 = rows[0][key]
    for r in rows:
        r["delta_k3"] = _delta(r[key], k0)
    steps = None
    if cumulative:
        steps, lp, sp = [rows[0]], learner0, sampler0
        for knob in knobs_for(learner0, sampler0, target):
            lp, sp, changes = switch(lp, sp, knob)
            r = row(knob.name, f"+ {knob.label}", lp, sp, changes)
            r["delta_k3"] = _delta(r[key], steps[-1][key])
            steps.append(r)
    return {"base": f"{learner0.name}:{sampler0.name}", "target": target.name, "key": key, "rows": rows,
            "cumulative": steps}


def _delta(value: float, ref: float) -> float:
    return value - ref if not (math.isnan(value) or math.isnan(ref)) else math.nan


def _jsonable(v):
    if isinstance(v, Quant):
        return dataclasses.asdict(v)
    return list(v) if isinstance(v, tuple) else v
