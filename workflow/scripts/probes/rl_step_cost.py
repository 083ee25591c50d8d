"""The step cost of an experiment's RL runs side by side on one GPU, measured before machine holds are sized for them.

Run from the repository root where the DAG already made the experiment's data and base model (on the GPU machine:
in `/tmp/minite-rl/repo` after `h200_rl.sh start hold_sweep`, with its PYTHONPATH and PATH):
    python3 workflow/scripts/probes/rl_step_cost.py CONFIG STEPS OUT RUN...
RUN: run names of the config's `rl.runs` (e.g. bf16__bf16__none minite__minite__none). Every run starts at once,
exactly as the `rl` rule starts it (same options and config section) but for STEPS steps with one held-out evaluation
at the end, each in OUT/rl/<run> (log: OUT/<run>.log). Then prints, per run, the median sampling and learning
seconds a step over the steps after the first two (start-up and compilation excluded; each run's pace while all share
the GPU), the slowest run's (the pace of a hold of these runs) and the whole wall time, start-up and the evaluation
included. OUT/step_cost.json has the same.
"""
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from snakemake.utils import validate

from minite_core.experiment import rl_runs
from minite_core.rule_args import run_options

config_path, steps, out, *names = sys.argv[1:]
config, steps, out = yaml.safe_load(Path(config_path).read_text()), int(steps), Path(out)
validate(config, "workflow/schemas/config.schema.yaml")  # the defaults the Snakefile's config gets
runs = rl_runs(config)
unknown = [n for n in names if n not in runs]
if unknown or not names:
    sys.exit(f"rl_step_cost: no run {unknown or '(none given)'} in {config_path}: one of {', '.join(runs)}")
results = Path("results") / config["experiment"]
section = {k: v for k, v in config["rl"].items() if k not in ("runs", "gpus_per_job")}
section.update(steps=steps, eval_every=steps, checkpoint_every=steps)
procs, t0 = {}, time.time()
for name in names:
    spec = runs[name]
    (out / "rl").mkdir(parents=True, exist_ok=True)
    cmd = (["minite", "rl", "--pretrained", str(results / "pretrain" / "model"), "--data", str(results / "data"),
            "--out", str(out / "rl" / name), "--name", name, "--learner", spec["learner"], "--sampler",
            spec["sampler"], "--correction", spec["correction"], "--threads", "1", "--no-progress"]
           + run_options(config, seed=spec["seed"]).split() + ["--config-json", json.dumps(section)])
    with (out / f"{name}.log").open("w") as log:  # the child keeps its own descriptor
        procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
codes = {name: p.wait() for name, p in procs.items()}
wall = time.time() - t0
report = {"config": config_path, "steps": steps, "wall_s": round(wall, 1), "exit": codes, "runs": {}}
for name in names:
    metrics = out / "rl" / name / "metrics.csv"
    rows = list(csv.DictReader(metrics.open())) if metrics.exists() else []
    timed = rows[2:] or rows
    med = {k: statistics.median(float(r[f"timing/{k}"]) for r in timed) if timed else None
           for k in ("sample_s", "learn_s")}
    report["runs"][name] = {**med, "response_len": statistics.mean(float(r["response/len_mean"]) for r in rows)
                            if rows else None, "steps_done": len(rows)}
done = [r for r in report["runs"].values() if r["sample_s"] is not None]
report["hold_s_per_step"] = round(max((r["sample_s"] + r["learn_s"] for r in done), default=0.0), 3)
(out / "step_cost.json").write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
