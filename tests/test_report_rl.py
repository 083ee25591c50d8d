"""The report's RL section from made-up summaries: pairs and their SEs, seed bands with one and two seeds, and the
claim (c) paragraph in each of its outcomes ("tracks", "falls behind", BF16 not learning, missing pairs, NaN)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from minite_core.report.build import section_rl
from minite_core.report.rl import claim_c, compare, pair_results, pair_table
from minite_core.rl.figures import load_runs, plot, seed_bands


def _summary(learner, sampler, correction="none", seed=0, *, initial=0.40, final=0.60, gain=None, gain_se=0.02,
             n=512, k3=1e-5):
    return {"schema": "rl/v1", "run": f"{learner}__{sampler}__{correction}" + (f"__s{seed}" if seed else ""),
            "config": {"learner": learner, "sampler": sampler, "correction": correction, "seed": seed},
            "metrics": {"steps": 300, "heldout_n": n, "heldout_acc_initial": initial, "heldout_acc_final": final,
                        "heldout_gain": final - initial if gain is None else gain, "heldout_gain_se": gain_se,
                        "mismatch/k3_mean": k3, "reward_first_quarter": 0.2, "reward_last_quarter": 0.5}}


def _claim(**finals):
    """Summaries: BF16 2 seeds (0.60, 0.62), then one seed per named pair."""
    pairs = {"minite": ("minite", "minite", "none"), "naive": ("te-nvfp4", "vllm-nvfp4", "none"),
             "marlin": ("te-nvfp4", "vllm-marlin-w4a16", "none"), "tis": ("te-nvfp4", "vllm-nvfp4", "tis")}
    out = [_summary("bf16", "bf16", final=0.60), _summary("bf16", "bf16", seed=1, final=0.62)]
    out += [_summary(*pairs[k], final=v) for k, v in finals.items()]
    return claim_c(pair_results(out))


def test_pair_results_standard_errors():
    pairs = pair_results([_summary("minite", "minite", final=0.5), _summary("bf16", "bf16", final=0.60),
                          _summary("bf16", "bf16", seed=1, final=0.62)])
    bf16, minite = pairs  # BF16 first
    assert bf16.key == ("bf16", "bf16", "none") and bf16.seeds == (0, 1)
    assert bf16.acc_final == pytest.approx(0.61)
    se_problems = math.sqrt(0.61 * 0.39 / 512)  # common to the seeds: not divided by 2
    se_seeds = pd.Series([0.60, 0.62]).std() / math.sqrt(2)
    assert bf16.se == pytest.approx(math.sqrt(se_problems ** 2 + se_seeds ** 2))
    gain_se_seeds = pd.Series([0.20, 0.22]).std() / math.sqrt(2)  # the gains' spread over the seeds
    assert bf16.gain == pytest.approx(0.21) and bf16.gain_se == pytest.approx(math.sqrt(0.02 ** 2 + gain_se_seeds ** 2))
    assert minite.se == pytest.approx(math.sqrt(0.25 / 512))  # one seed: the binomial SE alone
    verdict, d, se_d = compare(minite, bf16)
    assert verdict == "falls behind" and d == pytest.approx(-0.11) and se_d == pytest.approx(
        math.sqrt(minite.se ** 2 + bf16.se ** 2))
    table = pair_table(pairs)
    assert "| bf16 ↔ bf16 | 2 | 512 | 40.0% | 61.0% ±" in table and "| minite ↔ minite | 1 |" in table


def test_claim_supported():
    text = _claim(minite=0.605, naive=0.45, marlin=0.50, tis=0.55)
    assert "minite ↔ minite (1 seed): 60.5%" in text and "**tracks BF16**" in text
    assert text.count("**falls behind**") == 3  # both naive pairs and TIS
    assert "is **supported**" in text


def test_claim_not_supported_when_aligned_falls_behind_or_naive_tracks():
    assert "is **not supported**: the aligned pair falls behind BF16" in _claim(minite=0.45, naive=0.40)
    text = _claim(minite=0.61, naive=0.61)
    assert "te-nvfp4 ↔ vllm-nvfp4 (1 seed): 61.0%" in text and "a naive pair tracks BF16 as well" in text


def test_claim_partly_and_not_run():
    # the aligned pair tracks, one naive pair clearly below, the other ends above (neither tracks nor behind)
    assert "**partly supported**" in _claim(minite=0.61, naive=0.40, marlin=0.75)
    text = _claim(naive=0.40)  # no aligned pair: its input is missing, so no verdict
    assert "falls behind — is not run: it needs the runs of BF16 ↔ BF16, the aligned pair" in text
    assert "supported" not in text


def test_a_nan_accuracy_gives_no_verdict():
    """A NaN held-out accuracy in one seed's summary is not averaged away, and the claim says NaN."""
    runs = [_summary("bf16", "bf16", final=0.60), _summary("bf16", "bf16", seed=1, final=math.nan),
            _summary("minite", "minite", final=0.45), _summary("te-nvfp4", "vllm-nvfp4", final=0.40)]
    pairs = pair_results(runs)
    assert math.isnan(pairs[0].acc_final) and "| bf16 ↔ bf16 | 2 | 512 | 40.0% | NaN% ± NaN |" in pair_table(pairs)
    text = claim_c(pairs)
    assert "falls behind — is NaN: the held-out accuracy of bf16 ↔ bf16 is NaN" in text and "supported" not in text


def test_claim_needs_bf16_to_learn():
    flat = [_summary("bf16", "bf16", final=0.41, gain=0.01, gain_se=0.02), _summary("minite", "minite", final=0.41),
            _summary("te-nvfp4", "vllm-nvfp4", final=0.41)]
    text = claim_c(pair_results(flat))
    assert "BF16 itself did not learn measurably" in text and "supported" not in text
    assert "no BF16" in claim_c(pair_results([_summary("minite", "minite")]))


def _frame(pair, seed, acc_by_step):
    return pd.DataFrame({"pair": pair, "seed": seed, "step": list(acc_by_step),
                         "eval/acc": list(acc_by_step.values())})


def test_seed_bands_one_and_two_seeds():
    df = pd.concat([_frame("bf16:bf16", 0, {0: 0.4, 10: 0.5}), _frame("bf16:bf16", 1, {0: 0.4, 10: 0.7}),
                    _frame("minite:minite", 0, {0: 0.4, 10: 0.6})])
    b = seed_bands(df, "eval/acc").set_index(["pair", "step"])
    assert b.loc[("bf16:bf16", 10)].tolist() == pytest.approx([0.6, 0.5, 0.7, 2])  # mean, lo, hi, seeds
    assert b.loc[("minite:minite", 10)].tolist() == pytest.approx([0.6, 0.6, 0.6, 1])  # one seed: no spread
    smooth = seed_bands(df, "eval/acc", smooth=2).set_index(["pair", "step"])  # per seed, then across seeds
    assert smooth.loc[("bf16:bf16", 10), "hi"] == pytest.approx(0.55)


def _run_dir(root, summary, rows):
    d = root / summary["run"]
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame(rows).to_csv(d / "metrics.csv", index=False)
    return d


def test_section_and_figure_from_run_directories(tmp_path):
    rows = lambda acc: [{"step": s, "reward/mean": 0.3, "eval/acc": acc if s == 2 else None,  # noqa: E731
                         "response/len_mean": 90.0, "actor/entropy": 0.5, "mismatch/k3": 1e-5,
                         "mismatch/ratio_outside_C": 0.0} for s in (1, 2)]
    rl = tmp_path / "exp" / "rl"
    dirs = [_run_dir(rl, _summary("bf16", "bf16"), rows(0.6)), _run_dir(rl, _summary("bf16", "bf16", seed=1), rows(0.62)),
            _run_dir(rl, _summary("minite", "minite", final=0.59), rows(0.59))]
    df = load_runs(dirs)
    assert set(df["pair"]) == {"bf16:bf16", "minite:minite"} and set(df["seed"]) == {0, 1}
    assert df[(df["step"] == 0)]["eval/acc"].tolist() == [0.4, 0.4, 0.4]  # step 0 = heldout_acc_initial
    assert plot(df, tmp_path / "curves.png").stat().st_size > 0
    text = section_rl(tmp_path / "exp")
    assert "### Final held-out accuracy per pair" in text and "**tracks BF16**" in text and "bf16__bf16__none__s1" in text
