"""The report's RL section from `rl/*/summary.json` alone: runs, pairs with seeds, final held-out accuracy ± SE per
pair, and the paper's claim (c) read from those numbers.

Claim (c) (paper.md): long-horizon NVFP4 RL with *aligned* execution (miniTE on both sides) tracks BF16, while the
naive TE-NVFP4 stacks fall behind. How the verdict is computed, never written by hand:
- a *pair* = (learner, sampler, correction); its seeds are the runs of that pair. Its final held-out accuracy is
  the mean over seeds of `heldout_acc_final`, with SE = sqrt(SE_problems² + SE_seeds²): SE_problems the binomial
  SE of that accuracy on the `heldout_n` problems (common to all seeds — they score the same problems — so not
  divided by the number of seeds), SE_seeds = std over seeds / sqrt(seeds) (0 for one seed: RL's own randomness
  is then unmeasured, and the verdict says how many seeds it rests on).
- each pair is compared to BF16↔BF16 by d = acc − acc_BF16 and SE_d = sqrt(SE² + SE_BF16²) (independent errors:
  conservative, as both score the same problems): |d| ≤ SE_d → "tracks BF16"; d < −SE_d → "falls behind"
  (by d / SE_d SEs); d > SE_d → "ends above BF16".
- the claim can only be read if BF16 itself learned: its paired held-out gain over the base model must exceed
  2 SE (its SE: the mean per-seed paired SE, combined with the seeds' spread as above); otherwise the
  paragraph says so and stops there.
- the claim is supported when the aligned pair (minite↔minite) tracks or beats BF16 and every naive pair without
  correction falls behind; contradicted when the aligned pair falls behind or a naive pair tracks; else partly.
- no verdict from what was not measured: a pair the rule needs that has no summary.json makes it "not run"
  (a run directory or log without one is listed as failed: `unfinished`), a NaN accuracy among them "NaN".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from minite_core.report.common import NOT_RUN, absent
from minite_core.results import read_result

REFERENCE = ("bf16", "bf16", "none")
ALIGNED = ("minite", "minite", "none")
NAIVE_LEARNER = "te-nvfp4"


@dataclass(frozen=True)
class PairResult:
    """One engine pair's RL outcome over its seeds."""

    key: tuple[str, str, str]  # (learner, sampler, correction)
    runs: tuple[str, ...]
    seeds: tuple[int, ...]
    heldout_n: int
    acc_initial: float
    acc_final: float
    se: float
    gain: float  # mean over seeds of the paired gain
    gain_se: float
    k3_mean: float

    @property
    def label(self) -> str:
        learner, sampler, corr = self.key
        return f"{learner} ↔ {sampler}" + ("" if corr == "none" else f" + {corr.upper()}")


def _mean(xs: list[float]) -> float:
    """Mean over seeds of the values a file has (None: not recorded); a NaN stays NaN, never averaged away."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else math.nan


def _seed_se(xs: list[float]) -> float:
    """std over seeds / sqrt(seeds): 0 for one seed, NaN when a seed's value is NaN."""
    if len(xs) < 2:
        return 0.0
    return statistics.stdev(xs) / math.sqrt(len(xs)) if all(map(math.isfinite, xs)) else math.nan


def pair_results(summaries: list[dict]) -> list[PairResult]:
    """Group rl/v1 summaries by (learner, sampler, correction) -> PairResult per pair, BF16 first, then by name."""
    groups: dict[tuple, list[dict]] = {}
    for s in summaries:
        c = s["config"]
        groups.setdefault((c["learner"], c["sampler"], c.get("correction", "none")), []).append(s)
    out = []
    for key, runs in groups.items():
        m = [r["metrics"] for r in runs]
        n = min(int(x.get("heldout_n") or 0) for x in m)
        finals = [x["heldout_acc_final"] for x in m]
        acc = _mean(finals)
        se_problems = math.sqrt(acc * (1 - acc) / n) if n and math.isfinite(acc) else math.nan
        se_seeds = _seed_se(finals)
        gains = [x.get("heldout_gain", math.nan) for x in m]
        gain_ses = [x.get("heldout_gain_se", math.nan) for x in m]
        # the gain's SE the same way: the paired (problem) SE is common to the seeds, their spread is not
        gain_se_seeds = _seed_se(gains)
        gain_se = math.sqrt(_mean([g * g for g in gain_ses]) + gain_se_seeds ** 2)
        out.append(PairResult(key, tuple(r.get("run", "?") for r in runs),
                              tuple(r["config"].get("seed", 0) for r in runs), n,
                              _mean([x["heldout_acc_initial"] for x in m]), acc,
                              math.sqrt(se_problems ** 2 + se_seeds ** 2), _mean(gains), gain_se,
                              _mean([x.get("mismatch/k3_mean", math.nan) for x in m])))
    return sorted(out, key=lambda p: (p.key != REFERENCE, p.key))


def compare(p: PairResult, ref: PairResult) -> tuple[str, float, float]:
    """(verdict, d, SE_d) of pair p against the reference (module docstring)."""
    d, se_d = p.acc_final - ref.acc_final, math.sqrt(p.se ** 2 + ref.se ** 2)
    if not (math.isfinite(d) and math.isfinite(se_d)):
        return "cannot be compared", d, se_d
    if abs(d) <= se_d:
        return "tracks BF16", d, se_d
    return ("falls behind" if d < 0 else "ends above BF16"), d, se_d


def _pts(x: float) -> str:
    """A difference in percentage points, signed ("NaN" when the files hold NaN or nothing)."""
    return f"{100 * x:+.1f}" if math.isfinite(x) else "NaN"


def _pct(x: float) -> str:
    """An accuracy or an SE in percent / points ("NaN" when the files hold NaN or nothing)."""
    return f"{100 * x:.1f}" if math.isfinite(x) else "NaN"


def _unreadable(ref: PairResult | None) -> str | None:
    """Why claim (c) cannot be read from these runs (module docstring), None when it can."""
    if ref is None:
        return "Claim (c) cannot be read: no BF16 ↔ BF16 run in this experiment."
    if not math.isfinite(ref.gain):
        return ("These runs record no paired held-out gain (they predate `heldout_n`), so claim (c) cannot "
                "be read from them.")
    if not ref.gain > 2 * ref.gain_se:
        return ("BF16 itself did not learn measurably (gain ≤ 2 SE), so claim (c) — aligned NVFP4 tracks "
                "BF16 while the naive stack falls behind — cannot be read from these runs: tracking a policy "
                "that does not improve says nothing.")
    return None


def claim_c_verdict(pairs: list[PairResult]) -> tuple[str, str]:
    """(verdict, reason) of claim (c): verdict "supported", "not supported", "partly", "cannot be judged" (BF16 did
    not learn), "not run" (a pair it needs has no summary) or "NaN" (module docstring for the rule)."""
    ref = next((p for p in pairs if p.key == REFERENCE), None)
    needed = [p for p in pairs if p.key in (REFERENCE, ALIGNED) or (p.key[0] == NAIVE_LEARNER and p.key[2] == "none")]
    if ref is None or not any(p.key == ALIGNED for p in needed) or len(needed) < 3:
        return NOT_RUN, ("it needs the runs of BF16 ↔ BF16, the aligned pair (minite ↔ minite) and a naive pair "
                         "(te-nvfp4 ↔ a vLLM profile, no correction)")
    nan = [p.label for p in needed if not all(map(math.isfinite, (p.acc_final, p.se, p.acc_initial)))]
    if nan:
        return "NaN", f"the held-out accuracy of {', '.join(nan)} is NaN in its summary.json"
    why_not = _unreadable(ref)
    if why_not is not None:
        return "cannot be judged", why_not
    verdicts = {p.key: compare(p, ref)[0] for p in pairs if p.key != REFERENCE}
    aligned = verdicts.get(ALIGNED)
    naive = [v for k, v in verdicts.items() if k[0] == NAIVE_LEARNER and k[2] == "none"]
    if aligned in ("tracks BF16", "ends above BF16") and all(v == "falls behind" for v in naive):
        return "supported", "the aligned pair tracks BF16 and every naive pair falls behind"
    if aligned == "falls behind":
        return "not supported", "the aligned pair falls behind BF16"
    if "tracks BF16" in naive:
        return "not supported", "a naive pair tracks BF16 as well"
    return "partly", "the aligned pair tracks BF16, but not every naive pair falls behind"


def claim_c(pairs: list[PairResult]) -> str:
    """The claim (c) paragraph from the pair results (module docstring)."""
    ref = next((p for p in pairs if p.key == REFERENCE), None)
    if ref is None:
        return _unreadable(ref)
    seeds = lambda p: f"{len(p.seeds)} seed{'s' if len(p.seeds) > 1 else ''}"  # noqa: E731
    head = (f"BF16 ↔ BF16 ({seeds(ref)}, {ref.heldout_n} held-out problems) went from {_pct(ref.acc_initial)}% to "
            f"{_pct(ref.acc_final)}% held-out accuracy (paired gain {_pts(ref.gain)} ± {_pct(ref.gain_se)} points). ")
    word, reason = claim_c_verdict(pairs)
    if word == "cannot be judged":
        return head + reason
    lines = []
    for p in pairs:
        if p.key == REFERENCE:
            continue
        verdict, d, se_d = compare(p, ref)
        size = f"{abs(d) / se_d:.1f} SE" if se_d > 0 else "exactly"
        lines.append(f"{p.label} ({seeds(p)}): {_pct(p.acc_final)}% ± {_pct(p.se)}, {_pts(d)} points vs "
                     f"BF16 ({size}) — **{verdict}**")
    verdict = (f"{word}: {reason}" if word in (NOT_RUN, "NaN") else
               f"**{'partly supported' if word == 'partly' else word}**: {reason}")
    return (head + "Against it (1 SE rule, module `report/rl.py`):\n\n" + "\n".join(f"- {x}" for x in lines)
            + f"\n\nClaim (c) — long-horizon NVFP4 RL with aligned execution tracks BF16 while naive TE-NVFP4 falls "
              f"behind — is {verdict}.")


def pair_table(pairs: list[PairResult]) -> str:
    lines = ["| pair | seeds | held-out n | initial | final ± SE | gain ± SE (paired) | k3 mean |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for p in pairs:
        k3 = f"{p.k3_mean:.2e}" if math.isfinite(p.k3_mean) else "–"
        lines.append(f"| {p.label} | {len(p.seeds)} | {p.heldout_n or '–'} | {_pct(p.acc_initial)}% | "
                     f"{_pct(p.acc_final)}% ± {_pct(p.se)} | {_pts(p.gain)} ± {_pct(p.gain_se)} | {k3} |")
    return "\n".join(lines) + "\n"


def base_models(summaries: list[dict]) -> str:
    """A sentence when the runs start from more than one base checkpoint (the same SFT recipe trained again, e.g. in
    each machine hold: GPU training is not promised bitwise): which runs share which (summary.json `config.inputs`,
    the fingerprint of the checkpoint, the data and the code); "" when they all share one."""
    groups: dict[str, list[str]] = {}
    for s in summaries:
        groups.setdefault(s["config"].get("inputs", "?"), []).append(s.get("run", "?"))
    if len(groups) < 2:
        return ""
    return (f"These runs start from {len(groups)} base checkpoints, each an SFT of the same recipe (`config.inputs` "
            "of summary.json differs): " + "; ".join(", ".join(f"`{r}`" for r in runs) for runs in groups.values())
            + ".\n\n")


def load_summaries(results: Path) -> list[dict]:
    return [read_result(p, stage="rl") for p in sorted((results / "rl").glob("*/summary.json"))]


def unfinished(results: Path) -> dict[str, str]:
    """{run: why} for every RL run that has a run directory or a log but no summary.json (report.common.absent:
    failed, with its log's last line; or not run)."""
    names = {p.name for p in (results / "rl").glob("*") if p.is_dir()}
    names |= {p.stem for p in (results / "logs" / "rl").glob("*.log") if p.stem != "figures"}
    return {n: absent(results, f"logs/rl/{n}.log") for n in sorted(names)
            if not (results / "rl" / n / "summary.json").exists()}
