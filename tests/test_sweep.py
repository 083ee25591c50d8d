"""`minite sweep` (minite_core/sweep.py): a sweep file is checked before anything runs; a tiny sweep builds its data and
base model once, runs every (point, pair), ranks the rows by gain - 2 SE and, rerun, runs nothing again."""
from __future__ import annotations

import csv
import json

import pytest
import yaml

from minite_core.results import read_result
from minite_core import sweep as sweep_mod
from minite_core.sweep import load_sweep, points, run_sweep

BASE = {  # a tiny experiment: seconds per command (format credit: the barely trained model gets mixed rewards)
    "experiment": "sweeptest", "device": "cpu", "seed": 0,
    "data": {"levels": ["add2"], "n_train_per_level": 64, "n_heldout_per_level": 4},
    "pretrain": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "batch_size": 8, "lr": 0.01, "warmup_steps": 2, "max_steps": 30, "eval_every": 30,
                 "target_accuracy": [0.99, 1.0]},
    "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "eval_every": 2, "eval_n": 4, "max_new_tokens": 20,
           "format_credit": 0.5, "runs": ["bf16:bf16"]},
}


def _write(tmp_path, spec: dict, base: dict | None = None):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base or BASE))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"experiment": str(tmp_path / "base.yaml"), "out": str(tmp_path / "out"), **spec}))
    return path


@pytest.mark.parametrize("spec, match", [
    ({"grid": {"rl.lrr": [1e-3]}}, "grid key 'rl.lrr'"),
    ({"grid": {"optim.lr": [1e-3]}}, "grid key 'optim.lr'"),
    ({"grid": {"rl.lr": []}}, "non-empty list"),
    ({"grid": {"rl.lr": [1e-3]}, "pretrained": "m"}, "go together"),
    ({"grid": {"data.levels": [["add3"]]}, "pretrained": "m", "data": "d"}, "rl.\\* only"),
    ({"grid": {"rl.lr": [1e-3]}, "runs": ["bf16:nope"]}, "unknown sampler profile 'nope'"),
    ({"grid": [{"pairs": ["nope:bf16"]}]}, "unknown learner profile 'nope'"),
    ({"grid": {"rl.lr": [1e-3]}, "jobz": 2}, "unknown keys \\['jobz'\\]"),
])
def test_bad_sweep_files_fail_naming_the_key(tmp_path, spec, match):
    with pytest.raises(ValueError, match=match):
        load_sweep(_write(tmp_path, spec))


def test_points_union_and_value_checks(tmp_path):
    spec = {"grid": [{"rl.lr": [1e-3, 1e-4]}, {"rl.lr": [1e-4], "pairs": ["minite:minite"]}, {"rl.lr": [1e-3]}]}
    pts = points(load_sweep(_write(tmp_path, spec)))
    assert [(p["rl"]["lr"], list(runs)) for p, runs in pts] == [
        (1e-3, ["bf16__bf16__none"]), (1e-4, ["bf16__bf16__none"]), (1e-4, ["minite__minite__none"])]
    assert all("runs" not in p["rl"] and p["rl"]["steps"] == 2 for p, _ in pts)  # base values kept
    with pytest.raises(ValueError, match="group_size"):  # a value the config rejects fails before anything runs
        points(load_sweep(_write(tmp_path, {"grid": {"rl.group_size": [1]}})))


@pytest.mark.slow
def test_tiny_sweep_runs_ranks_and_resumes(tmp_path, monkeypatch):
    spec = {"grid": {"rl.lr": [1e-2, 1e-4]}, "seeds": [3]}
    sweep = load_sweep(_write(tmp_path, spec))
    rows = run_sweep(sweep)
    out = tmp_path / "out"
    assert len(rows) == 2 and len(list((out / "pretrain").iterdir())) == 1  # one base model for both points
    lcb = [r["gain_lcb"] for r in rows]
    assert lcb == sorted(lcb, reverse=True)
    with open(out / "sweep.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [r["rl.lr"] for r in table] == [r["rl.lr"] for r in rows]  # the CSV keeps the ranking
    for r in table:
        assert r["run"] == "bf16__bf16__none" and r["seed"] == "3" and r["heldout_n"] == "4"
        assert r["curve"].startswith("0:") and r["curve"].split()[-1].startswith("2:")
        assert float(r["rl_cpu_s"]) > 0 and float(r["pretrain_cpu_s"]) > 0 and float(r["step_s_median"]) > 0
        summary = read_result(out / "rl" / r["dir"] / "summary.json", stage="rl")
        assert summary["config"]["seed"] == 3 and summary["config"]["lr"] == json.loads(r["rl.lr"])
    assert read_result(out / "sweep.json", stage="sweep")["metrics"]["best"]["dir"] == table[0]["dir"]

    def no_command(*args, **kw):
        raise AssertionError(f"the rerun started a command: {args}")

    monkeypatch.setattr(sweep_mod, "_command", no_command)
    assert run_sweep(sweep) == rows  # everything was done: nothing runs again
    monkeypatch.undo()
    assert sweep_mod.main([str(tmp_path / "sweep.yaml")]) == 0

    # a run that fails (more held-out problems than the split has) does not lose the others' rows
    bad = load_sweep(_write(tmp_path, {"grid": [{"rl.lr": [1e-2]}, {"rl.eval_n": [5]}], "seeds": [3]}))
    with pytest.raises(RuntimeError, match="1 of 2 sweep runs failed"):
        run_sweep(bad)
    with open(out / "sweep.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert table[0]["gain"] and not table[0]["error"] and "eval_n" in table[1]["error"]


def test_a_sweep_on_a_machine_of_several_gpus_leases_one_a_run():
    """A base experiment with `gpus: G` gives every sweep command the DAG's --gpu-lease (runs/gpu_lease.py), with
    one job a GPU where the base leaves gpu_slots out."""
    opts = sweep_mod._run_options({"experiment": "x", "device": "cuda", "gpus": 8})
    assert opts[opts.index("--gpu-lease") + 1] == "8x1"
    assert "--gpu-lease" not in sweep_mod._run_options({"experiment": "x", "device": "cuda"})
