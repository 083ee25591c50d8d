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
