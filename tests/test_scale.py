"""NVFP4's cost against model size: `minite scale` on tiny SFT'd models (every profile measured, the results
contract, the paired drop arithmetic), the RL-size rule, the report's table / figure / claim (c) on made-up
results, and the model presets of the size ladder."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from minite_core.model import CausalLM
from minite_core.model.config import PRESETS
from minite_core.report import claims
from minite_core.report import scale as report_scale
from minite_core.results import read_result, write_result
from minite_core.rl import scale as scale_mod
from minite_core.rl.heldout import Heldout
from minite_core.rl.pretrain import PretrainConfig, model_vocab, pretrain
from minite_core.task import data as data_mod
from minite_core.task.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = {"levels": ["add2"], "n_train_per_level": 96, "n_heldout_per_level": 6, "tokenizer": "bpe"}
SIZES = {  # two tiny sizes of the sweep; 4 SFT steps each (the models stay untrained: the mechanics are tested)
    "s1": PretrainConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, batch_size=4,
                         lr=1e-2, warmup_steps=1, max_steps=4, eval_every=4, target_accuracy=(0.99, 1.0)),
    "s2": PretrainConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, batch_size=4,
                         lr=1e-2, warmup_steps=1, max_steps=4, eval_every=4, target_accuracy=(0.99, 1.0)),
}
CFG = scale_mod.ScaleConfig(eval_n=6, eval_batch_size=6, calibration_examples=4, max_new_tokens=6)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    data_mod.main(["--out", str(root / "data"), "--config-json", json.dumps(DATA)])
    for name, cfg in SIZES.items():
        pretrain(cfg, data_dir=root / "data", out=root / name, state_dir=root / name / "state", seed=0,
                 progress=False)
    return root


def test_scale_command_measures_every_profile(sweep, tmp_path):
    out = tmp_path / "scale" / "s2.json"
    assert scale_mod.main(["--checkpoint", str(sweep / "s2" / "model"), "--data", str(sweep / "data"), "--out",
                           str(out), "--size", "s2", "--no-progress", "--config-json",
                           json.dumps({"eval_n": 6, "eval_batch_size": 6, "calibration_examples": 4,
                                       "max_new_tokens": 6})]) == 0
    res = read_result(out, stage="scale")
    m = res["metrics"]
    assert m["size"] == "s2" and m["heldout_n"] == 6 and m["max_new_tokens"] == 6
    vocab = model_vocab(len(load_tokenizer(sweep / "data" / "tokenizer")))  # the BPE tokenizer's, rounded up
    assert m["num_parameters"] == CausalLM(SIZES["s2"].model_config(vocab)).num_parameters()
    assert m["base"] == {"steps": 4, "stop_reason": "max_steps", "in_band": False,
                         "heldout_accuracy": read_result(sweep / "s2" / "pretrain.json")["metrics"]["heldout_accuracy"]}
    assert list(m["profiles"]) == ["bf16", "minite", "te-nvfp4", "vllm-nvfp4"]
    assert res["config"]["calibration"]["examples"] == 4  # vllm-nvfp4's static scales were calibrated
    for p in m["profiles"].values():
        assert len(p["outcomes"]) == 6 and set(p["outcomes"]) <= {"0", "1"}
        assert p["drop"] == pytest.approx(m["profiles"]["bf16"]["acc"] - p["acc"], abs=1e-12)
    assert m["profiles"]["bf16"]["drop"] == 0.0 and m["profiles"]["bf16"]["drop_se"] == 0.0


def test_drop_is_paired_over_the_same_problems(sweep, monkeypatch):
    """drop = mean(bf16 - profile) per problem, SE = std of those differences / sqrt(n) (not the binomial SEs)."""
    made = {"bf16": [1, 1, 1, 0, 1, 0], "minite": [1, 0, 1, 0, 1, 0], "te-nvfp4": [0, 1, 1, 1, 1, 0],
            "vllm-nvfp4": [1, 1, 1, 0, 1, 0]}

    def fake(model, profile, tok, problems, **kw):
        return Heldout(tuple(bool(c) for c in made[profile.name]), tuple(e["level"] for e in problems), 5.0)

    monkeypatch.setattr(scale_mod, "evaluate", fake)
    metrics, _ = scale_mod.measure(sweep / "s1" / "model", sweep / "data", CFG, seed=0, progress=False)
    p = metrics["profiles"]
    assert p["minite"]["drop"] == pytest.approx(1 / 6) and p["minite"]["outcomes"] == "101010"
    d = [0, 1, 0, 0, 0, 0]
    assert p["minite"]["drop_se"] == pytest.approx(math.sqrt(sum((x - 1 / 6) ** 2 for x in d) / 5 / 6))
    assert p["te-nvfp4"]["drop"] == 0.0 and p["te-nvfp4"]["drop_se"] == pytest.approx(math.sqrt(2 / 5 / 6))
    assert p["vllm-nvfp4"]["drop"] == 0.0 and p["vllm-nvfp4"]["drop_se"] == 0.0


def test_scale_config_and_bad_input(sweep, tmp_path, capsys):
    with pytest.raises(ValueError, match="must include 'bf16'"):
        scale_mod.ScaleConfig(profiles=("minite", "vllm-nvfp4"))
    with pytest.raises(ValueError, match="nope"):
        scale_mod.ScaleConfig(profiles=("bf16", "nope"))
    from minite_core.cli import main

    code = main(["scale", "--checkpoint", str(tmp_path / "none"), "--data", str(sweep / "data"), "--out",
                 str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("minite scale: error:") and "none" in err[0]
    assert not (tmp_path / "x.json").exists()


# ---- the size ladder, the RL-size rule, the report ---------------------------------------------------------------
def test_presets_span_13m_to_0_83b():
    """The ladder's names are its parameter counts at the character vocabulary; the top is h200x8.yaml's model."""
    counts = {}
    for name in ("qwen3-moe-13m", "qwen3-moe-53m", "qwen3-moe-233m", "qwen3-moe-517m", "qwen3-moe-827m"):
        with torch.device("meta"):
            counts[name] = CausalLM(PRESETS[name]).num_parameters()
        assert round(counts[name] / 1e6) == int(name.rsplit("-", 1)[1][:-1]), (name, counts[name])
    assert counts["qwen3-moe-13m"] == 13_306_368 and counts["qwen3-moe-827m"] == 826_951_680
    cfg = PretrainConfig(preset="qwen3-moe-517m")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_experts) == (1024, 5, 64)
    with pytest.raises(ValueError, match="contradicts preset"):
        PretrainConfig(preset="qwen3-moe-517m", num_hidden_layers=3)
    with pytest.raises(ValueError, match="not a model preset"):
        PretrainConfig(preset="qwen3-moe-1t")


def _size(root, name, params, drops, steps=100, in_band=True):
    profiles = {"bf16": {"acc": 0.45, "se": 0.022, "drop": 0.0, "drop_se": 0.0}}
    profiles.update({p: {"acc": 0.45 - d, "se": 0.022, "drop": d, "drop_se": 0.01} for p, d in drops.items()})
    write_result(root / "scale" / f"{name}.json", stage="scale", experiment="t", config={},
                 metrics={"size": name, "num_parameters": params, "heldout_n": 512, "profiles": profiles,
                          "base": {"steps": steps, "stop_reason": "target", "in_band": in_band,
                                   "heldout_accuracy": 0.45}})


def test_rl_size_rule():
    def rows(*spec):
        return [{"metrics": {"size": n, "num_parameters": p, "profiles": {"minite": {"drop": d}}}} for n, p, d in spec]

    small_ok = rows(("13m", 13e6, 0.06), ("233m", 233e6, 0.01), ("517m", 517e6, 0.03), ("827m", 827e6, 0.015))
    assert report_scale.pick_rl_size(small_ok)[0] == "827m"  # a small size qualifying does not go below 0.5 B
    assert report_scale.pick_rl_size(rows(("517m", 517e6, 0.02), ("827m", 827e6, 0.01)))[0] == "517m"
    name, why = report_scale.pick_rl_size(rows(("517m", 517e6, 0.05), ("827m", 827e6, 0.03)))
    assert name == "827m" and "the largest measured" in why
    assert report_scale.pick_rl_size(rows(("13m", 13e6, 0.0)))[0] is None


def test_report_scale_section_figure_and_claim_c(tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    _size(exp, "13m", 13_945_344, {"minite": 0.061, "te-nvfp4": 0.07, "vllm-nvfp4": 0.09}, steps=150)
    _size(exp, "517m", 519_450_240, {"minite": 0.012, "te-nvfp4": 0.02, "vllm-nvfp4": 0.03})
    _size(exp, "827m", 829_507_584, {"minite": -0.004, "te-nvfp4": 0.01, "vllm-nvfp4": 0.02}, in_band=False)
    text = report_scale.section_scale(exp)
    assert "**517m**" in text and "No RL base model was trained in this experiment." in text
    rows = [line for line in text.splitlines() if line.startswith("| 13m") or line.startswith("| 827m")]
    assert rows[0].startswith("| 13m | 14 M | 150 (target) | 512 | 45.0% ± 2.2 | +6.1 ± 1.0 | +7.0 ± 1.0 | +9.0")
    assert "| 827m | 0.83 B | 100 (target, out of band) |" in rows[1] and "| -0.4 ± 1.0 |" in rows[1]
    figure = exp / "scale" / "drop_vs_params.png"
    assert report_scale.draw(exp) == figure and figure.stat().st_size > 0
    write_result(exp / "pretrain" / "pretrain.json", stage="pretrain", experiment="t", config={},
                 metrics={"num_parameters": 829_507_584})
    text = report_scale.section_scale(exp)
    assert "The RL runs start from size `827m`, not the rule's pick." in text
    assert "| RL not run |" in text  # the RL base model's row; no RL runs here
    assert claims._scale(exp) == ("on a base model of 0.83 B parameters (size `827m`: minite -0.4 ± 1.0 points from "
                                  "BF16 before RL): ")
    assert "![NVFP4's cost against model size](scale/drop_vs_params.png)" in report_scale.section_scale(exp)
    # RL runs of an earlier base model (a results folder assembled from runs of different commits): their final
    # checkpoint's shape names their model, and no row of the sweep is theirs
    import json

    from minite_core.model import PRESETS

    monkeypatch.setenv("MINITE_COMMIT", "0ld0000")
    run = exp / "rl" / "bf16__bf16__none"
    write_result(run / "summary.json", stage="rl", experiment="t", config={}, metrics={})
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text(json.dumps(PRESETS["tiny-moe"].to_hf()))
    text = report_scale.section_scale(exp)
    assert "The RL runs (`0ld0000`) started from another base model (" in text and "than pretrain/ (0.83 B" in text
    assert "RL base;" not in text and report_scale.rl_base_params(exp) is None
    assert claims._scale(exp).startswith("on an earlier base model than pretrain/'s")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "_not run_" in report_scale.section_scale(empty) and report_scale.draw(empty) is None


@pytest.mark.slow
def test_scale_experiment_runs_as_holds_on_fresh_machines_and_assembles(tmp_path):
    """experiments/scale-cpu.yaml as the H200 run goes (results/h200/PLAN.md): each hold on a fresh "machine" (its own
    work folder: h200_rl.sh start hold_<name>, wait, collect) — the sweep's two sizes, one the RL base model's; then
    the on-policy RL pair with its lm-eval, which makes its own data and base model again — and the report over the
    collected tarballs (h200_assemble.sh)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = root / "workflow" / "scripts"
    config = root / "experiments" / "scale-cpu.yaml"
    tarballs = []
    for hold in ("sweep", "rl"):
        work, out = tmp_path / f"machine-{hold}", tmp_path / f"out-{hold}"
        out.mkdir()
        env = {**os.environ, "WORK": str(work), "CONFIG": str(config), "PYTHON": sys.executable, "CORES": "2",
               "GPU_SLOTS": "0", "OUT": str(out)}
        for args in (["start", f"hold_{hold}"], ["wait", "850"], ["collect"]):
            res = subprocess.run(["bash", str(scripts / "h200_rl.sh"), *args], cwd=root, env=env, capture_output=True,
                                 text=True, timeout=900)
            assert res.returncode == 0, res.stdout + res.stderr
        assert "finished, exit 0" in (out / "status.txt").read_text(), (out / "status.txt").read_text()
        tarballs.append(str(out / "scale-cpu-results.tgz"))
    site = tmp_path / "here"
    site.mkdir()
    res = subprocess.run(["bash", str(scripts / "h200_assemble.sh"), *tarballs], cwd=site, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "CONFIG": str(config), "PYTHON": sys.executable,
                                                      "PYTHONPATH": str(root)})
    assert res.returncode == 0, res.stdout + res.stderr
    results = site / "results" / "scale-cpu"
    text = (results / "report.md").read_text()
    assert "| s32 |" in text and "| s48 |" in text and "RL base; claim (c)" in text
    assert (results / "scale" / "drop_vs_params.png").exists() and (results / "rl" / "curves.png").exists()
    summary = read_result(results / "rl" / "minite-onpolicy__minite-onpolicy__none" / "summary.json", "rl")
    assert summary["metrics"]["mismatch/k3_max"] == 0.0  # the on-policy pair: learner = sampler, bitwise
    assert json.loads((results / "data" / "data.json").read_text())["metrics"]["tokenizer"] == "bpe"
