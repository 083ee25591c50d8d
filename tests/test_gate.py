"""The mismatch budget (diagnostics.gate, `minite diagnose --k3-budget`): a pair over its k3 ceiling fails the
stage with one line naming the pair, k3, budget and first divergent op; a ceiling above the measured k3 passes."""
from __future__ import annotations

import json

import pytest

from minite_core.diagnostics.cli import main as diagnose_main
from minite_core.diagnostics.gate import check_budgets, parse_budgets, violation_line
from minite_core.model import PRESETS, CausalLM, save_pretrained

PAIR = "te-nvfp4:vllm-nvfp4"
ERROR = "minite diagnose: error: "

pytestmark = pytest.mark.usefixtures("one_thread")


def test_parse_budgets():
    pairs = ["bf16:bf16", PAIR]
    assert parse_budgets([], pairs) == {}
    assert parse_budgets(["1e-3"], pairs) == {"bf16:bf16": 1e-3, PAIR: 1e-3}
    assert parse_budgets([f"{PAIR}=0.5", "1e-3"], pairs) == {"bf16:bf16": 1e-3, PAIR: 0.5}  # own value wins
    assert parse_budgets([f"{PAIR}=0"], pairs) == {PAIR: 0.0}
    for bad, match in (("x", "a number"), ("-1", ">= 0"), ("nope:nope=1", "not measured"), ("nan", ">= 0")):
        with pytest.raises(ValueError, match=match):
            parse_budgets([bad], pairs)


def test_check_budgets_and_line():
    metrics = {PAIR: {"mismatch/k3": 0.25}, "bf16:bf16": {"mismatch/k3": float("nan")}}
    traces = [{"pair": PAIR, "sut_mode": "prefill", "first_divergence": {"op": "a", "rel_err": 0.1}},
              {"pair": PAIR, "sut_mode": "decode", "first_divergence": {"op": "b", "rel_err": 0.2}}]
    rows = check_budgets(metrics, {PAIR: 0.25, "bf16:bf16": 1.0}, traces)
    assert rows[0]["pass"] and not rows[1]["pass"]  # k3 == budget passes; nan (nothing measured) fails
    assert rows[0]["first_divergence"] == {"op": "b", "rel_err": 0.2, "sut_mode": "decode"}  # the real pair's
    fail = check_budgets(metrics, {PAIR: 0.1}, traces)[0]
    assert violation_line(fail) == (f"mismatch budget exceeded for {PAIR}: k3 = 2.500e-01 > budget 1.000e-01; "
                                    "first divergent op: b (decode trace, rel. error 2.00e-01)")
    assert "not traced" in violation_line(check_budgets(metrics, {PAIR: 0.1}, None)[0])


def _diagnose(ckpt, out, *budget):
    return diagnose_main(["--checkpoint", str(ckpt), "--pairs", PAIR, "--num-prompts", "4", "--max-new-tokens", "8",
                          "--seed", "0", "--out", str(out)] + [a for b in budget for a in ("--k3-budget", b)])


def test_gate_fails_below_and_passes_above_the_measured_k3(tmp_path, capsys):
    ckpt = save_pretrained(CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3), tmp_path / "ckpt")
    assert _diagnose(ckpt, tmp_path / "a.json", f"{PAIR}=1e9") == 0
    res = json.loads((tmp_path / "a.json").read_text())
    k3 = res["metrics"][PAIR]["mismatch/k3"]
    assert k3 > 0 and res["budget"][0]["pass"] and res["config"]["k3_budget"] == {PAIR: 1e9}
    assert ERROR not in capsys.readouterr().err

    assert _diagnose(ckpt, tmp_path / "b.json", str(k3 * 2)) == 0  # above the measured k3: passes
    assert ERROR not in capsys.readouterr().err

    assert _diagnose(ckpt, tmp_path / "c.json", str(k3 / 2)) == 1  # below: the stage fails
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR)]
    assert len(errors) == 1
    assert errors[0].startswith(f"{ERROR}mismatch budget exceeded for {PAIR}: k3 = {k3:.3e} > budget {k3 / 2:.3e}; "
                                "first divergent op: model.layers.0.self_attn.q_proj (decode trace")  # traced now
    row = json.loads((tmp_path / "c.json").read_text())["budget"][0]
    assert not row["pass"] and row["first_divergence"]["op"] == "model.layers.0.self_attn.q_proj"


def test_budget_for_an_unmeasured_pair_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _diagnose(tmp_path / "missing", tmp_path / "x.json", "minite:minite=1")
    assert exc.value.code == 2 and "not measured" in capsys.readouterr().err


def test_ceilings_name_metrics_as_users_do():
    from minite_core.diagnostics.gate import check_ceilings, gate_line, parse_ceilings

    c = parse_ceilings(["gen_kl_error=0.03", "b:k3=1e-4", "mismatch_k3_kl=0.5"], ["a", "b"])
    assert c == {"a": {"train/gen_kl_error": 0.03, "rollout_corr/k3_kl": 0.5},
                 "b": {"train/gen_kl_error": 0.03, "rollout_corr/k3_kl": 0.5, "mismatch/k3": 1e-4}}
    with pytest.raises(ValueError, match="pair 'c' is not measured"):
        parse_ceilings(["c:k3=1"], ["a"])
    with pytest.raises(ValueError, match="X a number"):
        parse_ceilings(["k3=big"], ["a"])
    metrics = {"a": {"train/gen_kl_error": 0.02, "rollout_corr/k3_kl": 0.6}, "b": {"train/gen_kl_error": 0.04}}
    rows = check_ceilings(metrics, {"a": c["a"], "b": {"train/gen_kl_error": 0.03, "mismatch/k3": 1e-4}})
    verdict = {(r["pair"], r["metric"]): r["pass"] for r in rows}
    assert verdict == {("a", "train/gen_kl_error"): True, ("a", "rollout_corr/k3_kl"): False,
                       ("b", "train/gen_kl_error"): False, ("b", "mismatch/k3"): False}  # a missing metric fails
    line = gate_line(next(r for r in rows if r["pair"] == "b" and r["metric"] == "train/gen_kl_error"))
    assert line == "mismatch gate failed for b: train/gen_kl_error = 4.000e-02 > 3.000e-02 (ceiling)"


def test_history_gate_is_skyrls_rule():
    """max of the last N runs + x% (min - x% where higher is better); earlier runs beyond N do not count."""
    from minite_core.diagnostics.gate import check_history, history_limit

    assert history_limit([1.0, 3.0, 2.0], "mismatch/k3", 0.05) == pytest.approx(3.15)
    assert history_limit([0.9, 0.8], "mismatch/ess", 0.05) == pytest.approx(0.76)
    history = [{"a": {"mismatch/k3": 10.0}}] + [{"a": {"mismatch/k3": v}} for v in (1.0, 2.0)]
    rows = check_history({"a": {"mismatch/k3": 2.05, "mismatch/ess": 0.5}, "new": {"mismatch/k3": 9.0}}, history,
                         ["k3", "mismatch/ess"], last=2, tolerance=0.05)
    assert len(rows) == 1  # no earlier ess, no earlier pair "new": nothing to be within x% of
    assert rows[0]["limit"] == pytest.approx(2.1) and rows[0]["pass"] and "max of the last 2 runs +5%" in rows[0]["rule"]
    rows = check_history({"a": {"mismatch/k3": 2.2}}, history, ["k3"], last=2, tolerance=0.05)
    assert not rows[0]["pass"]
