"""The report never reads absence or NaN as a number: a missing results file is *not run*, *failed* (its log ends
in an error) or *missing* (the stage ran); a NaN prints as NaN and gives no claim a verdict; a results file that
is empty, cut short, not an object or of another schema is an error naming it."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from minite_core.report import claims
from minite_core.report.build import section_mismatch, section_rl
from minite_core.report.common import absent, fmt, load
from minite_core.results import read_result, write_result

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, match", [
    ("", "is not a valid results file"),
    ('{"schema": "rl/v1", "metr', "is not a valid results file"),
    ("[1, 2]", r"is not a results file \(a JSON list"),
    ('{"schema": "eval/v1", "metrics": {}}', "schema 'eval/v1' is not rl/v1"),
    ('{"metrics": {}}', "schema None is not rl/v1"),
])
def test_unusable_results_files_are_errors_naming_them(tmp_path, text, match):
    path = tmp_path / "rl" / "run" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{path}.*{match}|{match}"):
        read_result(path, "rl")
    with pytest.raises(ValueError) as err:
        section_rl(tmp_path)
    assert str(path) in str(err.value)


def test_minite_report_names_a_truncated_file(tmp_path):
    results = tmp_path / "exp"
    write_result(results / "diagnostics" / "mismatch.json", stage="diagnostics", experiment="exp", config={},
                 metrics={})
    bad = results / "diagnostics" / "mismatch.json"
    bad.write_text(bad.read_text()[:40])
    res = subprocess.run([sys.executable, "-m", "minite_core.cli", "report", "--results", str(results), "--out",
                          str(tmp_path / "r.md")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and str(bad) in lines[0], res.stderr
    assert not (tmp_path / "r.md").exists()


def test_not_run_failed_and_missing_are_told_apart(tmp_path):
    assert absent(tmp_path, "logs/diagnostics.log") == "_not run_"
    log = tmp_path / "logs" / "diagnostics.log"
    log.parent.mkdir()
    log.write_text("[diagnose] pairs: 4\nminite diagnose: error: results/x/model is damaged (--debug shows ...)\n")
    assert absent(tmp_path, "logs/diagnostics.log").startswith("**failed** (`logs/diagnostics.log` ends: "
                                                               "`minite diagnose: error: results/x/model is damaged")
    log.write_text("[diagnose] wrote 6 figures\n")
    assert absent(tmp_path, "logs/diagnostics.log").startswith("**missing**")
    assert "**missing**" in section_mismatch(tmp_path)
    assert claims.claim_a(load(tmp_path / "diagnostics" / "mismatch.json", "diagnostics"))[1] == "not run"


def test_nan_is_printed_and_never_judged():
    assert fmt(math.nan) == "NaN" and fmt(None) == "–" and fmt(0.5) == "0.500"
    pair = {"mismatch/k3": 1e-2, "mismatch/k3_se": 1e-4, "mismatch/max_abs_delta": 0.0}
    mm = {"metrics": {"bf16:bf16": {"mismatch/k3": 1e-5, "mismatch/k3_se": 1e-6},
                      "te-nvfp4:vllm-nvfp4": dict(pair), "minite:minite": {**pair, "mismatch/k3": 2e-5}}}
    assert claims.claim_a(mm)[1] == "supported" and claims.claim_b(mm)[1] == "partly"
    mm["metrics"]["bf16:bf16"]["mismatch/k3"] = math.nan
    for claim in (claims.claim_a, claims.claim_b):
        text, verdict = claim(mm)
        assert verdict == "NaN" and "k3 of `bf16:bf16` is NaN or missing" in text


def test_rl_runs_without_a_summary_are_listed(tmp_path):
    write_result(tmp_path / "rl" / "bf16__bf16__none" / "summary.json", stage="rl", experiment="t",
                 config={"learner": "bf16", "sampler": "bf16", "seed": 0}, run="bf16__bf16__none",
                 metrics={"steps": 2, "heldout_n": 4, "heldout_acc_initial": 0.5, "heldout_acc_final": 0.5})
    (tmp_path / "rl" / "minite__minite__none" / "state").mkdir(parents=True)
    log = tmp_path / "logs" / "rl" / "minite__minite__none.log"
    log.parent.mkdir(parents=True)
    log.write_text("minite rl: error: rl step 3: non-finite gradient at model.layers.0.mlp.experts.down\n")
    text = section_rl(tmp_path)
    assert ("- `minite__minite__none`: no summary.json, **failed** (`logs/rl/minite__minite__none.log` ends: "
            "`minite rl: error: rl step 3") in text
    assert claims.claim_c(tmp_path)[1] == "not run"
    assert json.loads((tmp_path / "rl" / "bf16__bf16__none" / "summary.json").read_text())["schema"] == "rl/v1"
