"""Claims against the paper, point by point: one row per claim (a)–(e), every number read from this experiment's
results files (or the committed real-peer measurements), every verdict computed by a rule written here.

Verdicts are "supported", "not supported", "partly", "not run" (an input file, or the pair it needs, is missing) or
"NaN" (a number the rule needs is NaN in its file): no verdict is ever read from a missing or NaN input. Claim (c)
adds "cannot be judged" (report/rl.py: BF16 did not learn). The rules:
- (a) same weights + same format ≠ same policy (diagnostics/mismatch.json): a cross-engine NVFP4 pair (learner
  profile ≠ sampler profile, both NVFP4) runs *a different policy* when k3 − 2·SE > max(k3(bf16:bf16),
  HEALTHY_K3). Supported when every such pair does, partly when some do, not supported when none does.
- (b) aligned execution at the BF16 level: minite:minite is *at the BF16 level* when k3(minite) ≤ k3(bf16) +
  2·sqrt(SE_minite² + SE_bf16²); the on-policy pair (minite-onpolicy) is *bitwise* when its k3 and max |Δ| are
  both exactly 0. Supported = at the level and bitwise; partly = at the level, on-policy pair not bitwise or not
  run; not supported = above the level.
- (c) long-horizon RL (rl/*/summary.json): report/rl.py's claim_c_verdict (1 SE rule against BF16), the same rule
  at any model size; the row names the RL base model's size and, where the NVFP4-cost sweep measured it
  (report/scale.py), its minite drop from BF16 before any RL step. Stability is shown beside it: a pair
  *collapsed* when its paired held-out gain is below −2 SE (it ended worse than it began).
- (d) throughput (throughput/learner.json, sampler.json): judged only where the file says its targets apply (a GPU
  run). Supported = miniTE's learner update faster than both BF16 and TE-NVFP4 (the paper's direction); partly =
  faster than TE-NVFP4 only; not supported = not faster than TE-NVFP4.
- (e) emulation fidelity (results/vllm-cpu/vllm_peer/ratios.json; te/agreement.json): the vLLM part passes when
  the peer's own check does (`nvfp4_ok`: our vllm-nvfp4-cpu sampler within its target × the dense floor of real
  vLLM); the TE part passes when k3(our te-nvfp4 emulation ↔ real TE, end to end) ≤ HEALTHY_K3. Supported = every
  measured part passes, partly = some, not supported = none.
"""
from __future__ import annotations

import math
from pathlib import Path

from minite_core.profiles import PROFILES
from minite_core.report.common import NOT_RUN, fmt, load, table, vllm_peer_dir
from minite_core.report.rl import claim_c_verdict, load_summaries, pair_results
from minite_core.report.scale import HEAD as SCALE_HEAD, load_sizes, params_text, rl_base_other, rl_base_params
from minite_core.report.tables import WHY_NOT_HOPPER
from minite_core.report.te import HEAD as TE_HEAD, claim_agreement, te_nvfp4_agreement

HEALTHY_K3 = 1e-3  # NeMo-RL treats gen_kl_error < 1e-3 as healthy (paper.md)
REFERENCE_PAIR, ALIGNED_PAIR, ONPOLICY_PAIR = "bf16:bf16", "minite:minite", "minite-onpolicy:minite-onpolicy"
NAN = "NaN"
# the sections each claim points to (their headings in build.py / te.py; tests/test_report_claims.py checks them)
MISMATCH = "Learner ↔ sampler mismatch by engine pair"
RL = "Long-horizon RL per engine pair (GRPO)"
THROUGHPUT = "Learner-update throughput: BF16 vs TE-NVFP4 vs miniTE"
SAMPLER = "Sampler throughput: decode tokens/s per profile × shape × batch"
PEERS = "Real peers (committed CPU measurement against real vLLM)"


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return "#" + "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_").replace(" ", "-")


def _link(heading: str, text: str) -> str:
    return f"[{text}]({anchor(heading)})"


def _share(flags: list[bool]) -> str:
    return "supported" if all(flags) else ("partly" if any(flags) else "not supported")


def _k3(m: dict) -> tuple[float, float]:
    se = m.get("mismatch/k3_se")
    return m["mismatch/k3"], 0.0 if se is None else se


def _not_finite(values: dict) -> str | None:
    """The reason no verdict can be read when a number a rule needs is NaN (or absent) in its file, else None."""
    bad = [name for name, v in values.items() if not isinstance(v, (int, float)) or not math.isfinite(v)]
    return f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} NaN or missing in the results file" if bad else None


def _nvfp4(profile: str) -> bool:
    return profile in PROFILES and PROFILES[profile].weight is not None


def claim_a(mm: dict | None) -> tuple[str, str]:
    """(measured, verdict) of claim (a) from diagnostics/mismatch.json (module docstring)."""
    metrics = (mm or {}).get("metrics", {})
    cross = {p: m for p, m in metrics.items() if p.count(":") == 1 and p.split(":")[0] != p.split(":")[1]
             and all(_nvfp4(x) for x in p.split(":"))}
    if REFERENCE_PAIR not in metrics or not cross:
        return "needs the mismatch diagnostics with bf16:bf16 and a cross-engine NVFP4 pair", NOT_RUN
    why = _not_finite({f"{key} of `{p}`": v for p in (REFERENCE_PAIR, *cross)
                       for key, v in zip(("k3", "k3 SE"), _k3(metrics[p]))})
    if why:
        return why, NAN
    k3_ref = _k3(metrics[REFERENCE_PAIR])[0]
    floor = max(k3_ref, HEALTHY_K3)
    differs = [_k3(m)[0] - 2 * _k3(m)[1] > floor for m in cross.values()]
    pairs = "; ".join(f"`{p}` {fmt(_k3(m)[0])} ± {fmt(_k3(m)[1])}" for p, m in cross.items())
    return (f"k3 per cross-engine NVFP4 pair (same checkpoint, same prompts): {pairs}; vs bf16:bf16 {fmt(k3_ref)} "
            f"and the healthy threshold {HEALTHY_K3:g}: {sum(differs)} of {len(differs)} pairs above both by "
            "> 2 SE"), _share(differs)


def claim_b(mm: dict | None) -> tuple[str, str]:
    """(measured, verdict) of claim (b) from diagnostics/mismatch.json (module docstring)."""
    metrics = (mm or {}).get("metrics", {})
    if REFERENCE_PAIR not in metrics or ALIGNED_PAIR not in metrics:
        return "needs the mismatch diagnostics with bf16:bf16 and minite:minite", NOT_RUN
    (k3_m, se_m), (k3_b, se_b) = _k3(metrics[ALIGNED_PAIR]), _k3(metrics[REFERENCE_PAIR])
    onpolicy = metrics.get(ONPOLICY_PAIR)
    why = _not_finite({f"k3 of `{ALIGNED_PAIR}`": k3_m, f"k3 SE of `{ALIGNED_PAIR}`": se_m,
                       f"k3 of `{REFERENCE_PAIR}`": k3_b, f"k3 SE of `{REFERENCE_PAIR}`": se_b,
                       **({} if onpolicy is None else {f"k3 of `{ONPOLICY_PAIR}`": onpolicy["mismatch/k3"],
                                                      f"max |Δ| of `{ONPOLICY_PAIR}`":
                                                          onpolicy.get("mismatch/max_abs_delta")})})
    if why:
        return why, NAN
    at_level = k3_m <= k3_b + 2 * math.hypot(se_m, se_b)
    ratio = fmt(k3_m / k3_b) if k3_b > 0 else "– (bf16 k3 is 0)"
    text = (f"k3(minite) / k3(bf16) = {fmt(k3_m)} / {fmt(k3_b)} = {ratio} "
            f"({'at or below' if at_level else 'above'} the BF16 level, k3(bf16) + 2 SE); ")
    onpolicy = metrics.get(ONPOLICY_PAIR)
    if onpolicy is None:
        return text + f"the on-policy pair (`{ONPOLICY_PAIR}`) was not run", ("partly" if at_level else
                                                                               "not supported")
    k3_o, delta_o = onpolicy["mismatch/k3"], onpolicy.get("mismatch/max_abs_delta")
    bitwise = k3_o == 0 and delta_o == 0
    text += (f"on-policy pair k3 {fmt(k3_o)}, max abs Δ {fmt(delta_o)} "
             f"({'bitwise' if bitwise else 'not bitwise'})")
    return text, ("supported" if bitwise else "partly") if at_level else "not supported"


def claim_c(results: Path) -> tuple[str, str]:
    """(measured, verdict) of claim (c) from rl/*/summary.json (module docstring)."""
    summaries = load_summaries(results)
    if not summaries:
        return "needs the RL runs", NOT_RUN
    pairs = pair_results(summaries)
    word, reason = claim_c_verdict(pairs)
    if word == NOT_RUN:
        return f"needs the RL runs: {reason}", NOT_RUN
    if word == NAN:
        return reason, NAN
    finals = "; ".join(f"{p.label} {100 * p.acc_final:.1f}% ± {100 * p.se:.1f}" for p in pairs)
    collapsed = [p.label for p in pairs if p.gain < -2 * p.gain_se]
    stability = (f"collapsed (final below initial by > 2 SE): {', '.join(collapsed)}" if collapsed
                 else "no pair collapsed (final below initial by > 2 SE)")
    return f"{_scale(results)}final held-out accuracy ± SE: {finals}; {stability}", f"{word}: {reason}"


def _scale(results: Path) -> str:
    """Which model claim (c) is judged on: its parameters, and its NVFP4 cost where the sweep measured it."""
    params = rl_base_params(results)
    if params is None:
        return "on an earlier base model than pretrain/'s (see the size section): " if rl_base_other(results) else ""
    row = next((r["metrics"] for r in load_sizes(results) if r["metrics"]["num_parameters"] == params), None)
    drop = (row or {}).get("profiles", {}).get("minite")
    cost = (f" (size `{row['size']}`: minite {100 * drop['drop']:+.1f} ± {100 * drop['drop_se']:.1f} points from "
            "BF16 before RL)") if drop else ""
    return f"on a base model of {params_text(params)} parameters{cost}: "


def _sampler_ratios(res: dict) -> str:
    """× BF16 decode tokens/s of each profile at the largest batch of the experiment's RL model (the "model" shape,
    which the DAG times on the RL base model's config), else of the small RL shape."""
    rows = {s: [r for r in res["rows"] if r.get("shape") == s and r.get("speedup_vs_bf16") is not None]
            for s in ("model", "rl")}
    shape = "model" if rows["model"] else "rl"
    rows = rows[shape]
    if not rows:
        return "sampler: no RL-shape rows"
    batch = max(r["batch"] for r in rows)
    name = "the RL model's shape" if shape == "model" else "RL shape"
    return f"sampler ({name}, batch {batch}) × BF16: " + ", ".join(
        f"{r['profile']} {r['speedup_vs_bf16']:.2f}" for r in rows if r["batch"] == batch and r["profile"] != "bf16")


def claim_d(results: Path) -> tuple[str, str]:
    """(measured, verdict) of claim (d) from throughput/{learner,sampler}.json (module docstring)."""
    learner = load(results / "throughput" / "learner.json", "throughput")
    row = next((r for r in (learner or {}).get("rows", []) if r["profile"] == "minite"), None)
    if row is None:
        return "needs the learner throughput benchmark", NOT_RUN
    x_bf16, x_te = row["speedup_vs_bf16"], row["speedup_vs_te_nvfp4"]
    why = _not_finite({"miniTE's learner × BF16": x_bf16, "miniTE's learner × TE-NVFP4": x_te})
    if why:
        return why, NAN
    sampler = load(results / "throughput" / "sampler.json", "throughput")
    text = (f"on {learner['env'].get('gpu')}: learner miniTE {x_bf16:.3f}× BF16, {x_te:.3f}× TE-NVFP4; "
            + (_sampler_ratios(sampler) if sampler else "sampler not run")
            + ". Why Hopper cannot show the B300 headline: " + " ".join(WHY_NOT_HOPPER.split()))
    if not learner.get("targets", {}).get("applicable"):
        return text, f"{NOT_RUN} (not a GPU measurement: the file's targets do not apply)"
    return text, "supported" if x_bf16 > 1 and x_te > 1 else ("partly" if x_te > 1 else "not supported")


def _vllm_part(ratios: dict | None) -> tuple[str, bool | None]:
    if ratios is None:
        return "real vLLM: not run", None
    m = ratios["metrics"]
    return (f"real vLLM (CPU): k3(our vllm-nvfp4-cpu ↔ vLLM NVFP4) = {fmt(m['nvfp4_over_floor'])}× the dense "
            f"floor {fmt(m['dense_floor_k3'])} (target ≤ {m['targets']['nvfp4_over_floor']:g}×), the GPU profile "
            f"vllm-nvfp4 as is {fmt(m['nvfp4_gpu_profile_over_floor'])}×; BF16 MoE sampler "
            f"{fmt(m['moe_over_floor'])}× (with vllm-bf16-cpu {fmt(m['moe_vllm_bf16_cpu_over_floor'])}×)",
            bool(m["nvfp4_ok"]))


def _te_part(agreement: dict | None) -> tuple[str, bool | str | None]:
    te = te_nvfp4_agreement(agreement) if agreement else None
    if te is None:
        return "real TE: not run", None
    return (f"real TE {agreement['config'].get('transformer_engine')} ({agreement['env'].get('gpu')}; model: "
            f"{agreement['config'].get('checkpoint')}): "
            f"k3(our te-nvfp4 emulation ↔ TE `{te['mode']}`) = {fmt(te['k3'])}, max abs Δ {fmt(te['max_abs_delta'])} "
            f"(TE's own NVFP4 ↔ BF16 k3: {fmt(te['te_quant_k3'])}; threshold {HEALTHY_K3:g})",
            NAN if not math.isfinite(te["k3"]) else te["k3"] <= HEALTHY_K3)


def claim_e(results: Path) -> tuple[str, str]:
    """(measured, verdict) of claim (e) from the vLLM peer's ratios.json and te/agreement.json (module docstring)."""
    parts = [_vllm_part(load(vllm_peer_dir(results) / "ratios.json", "vllm_peer")),
             _te_part(claim_agreement(results))]
    passed = [ok for _, ok in parts if ok is not None]
    text = "; ".join(text for text, _ in parts)
    return text, NAN if NAN in passed else _share(passed) if passed else NOT_RUN


CLAIMS = [  # (claim, the paper's words, short; where)
    ("a", "matching weights and numerical formats is insufficient for consistent policy evaluation",
     [(MISMATCH, "mismatch")]),
    ("b", "cross-engine numerical alignment (miniTE) brings the mismatch to the BF16 level; on-policy bitwise",
     [(MISMATCH, "mismatch")]),
    ("c", "long-horizon RL: stable, close to BF16, better than naive TE NVFP4",
     [(RL, "RL"), (SCALE_HEAD.strip("# "), "size")]),
    ("d", "the optimized learner beats BF16 and TE NVFP4 throughput (one B300 node)",
     [(THROUGHPUT, "learner"), (SAMPLER, "sampler")]),
    ("e", "(this harness) the emulated vLLM and TE profiles execute as the real engines do",
     [(PEERS, "real vLLM"), (TE_HEAD.strip("# \n"), "real TE")]),
]


def section_claims(results: Path) -> str:
    mm = load(results / "diagnostics" / "mismatch.json", "diagnostics")
    measured = {"a": claim_a(mm), "b": claim_b(mm), "c": claim_c(results), "d": claim_d(results),
                "e": claim_e(results)}
    rows = [[f"({key})", words, measured[key][0], f"**{measured[key][1]}**",
             ", ".join(_link(h, t) for h, t in where)] for key, words, where in CLAIMS]
    return ("## Claims against the paper, point by point\n\n"
            "Each number below is read from this experiment's results files (or the committed real-peer "
            "measurements), each verdict is computed by a rule stated in `minite_core/report/claims.py`: (a) a "
            f"cross-engine NVFP4 pair is a different policy when k3 − 2 SE exceeds both k3(bf16:bf16) and "
            f"{HEALTHY_K3:g}; (b) minite:minite is at the BF16 level when its k3 ≤ k3(bf16:bf16) + 2 SE, "
            "and *supported* needs the on-policy pair bitwise (k3 = max |Δ| = 0); (c) the RL section's 1 SE rule; "
            "(d) judged on a GPU run only: faster than BF16 and TE-NVFP4 = supported, than TE-NVFP4 only = partly; "
            f"(e) our vLLM profile within the peer's target, our TE emulation's end-to-end k3 ≤ {HEALTHY_K3:g}. "
            "A missing input makes its row *not run*, a NaN one *NaN*: never a verdict.\n\n"
            + table(["claim", "the paper says", "what we measured", "verdict", "where"], rows))
