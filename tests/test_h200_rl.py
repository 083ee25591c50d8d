"""workflow/scripts/h200_rl.sh on CPU, against a tiny experiment: `start` returns at once with the DAG running
under setsid in $WORK; `status` answers with one line per RL run; `stop` kills the job mid-run and a second
`start` resumes it — the run's metrics equal an uninterrupted run's (timing aside); `collect` (which every
`wait` ends with) packs the results without checkpoints, resume state or eval samples; a config's `gpu_name`
keeps it off other GPUs."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "workflow" / "scripts" / "h200_rl.sh"
RUN = "bf16__bf16__none"
CONFIG = {
    "experiment": "h200rltest", "device": "cpu", "seed": 0,
    "data": {"levels": ["add2"], "n_train_per_level": 64, "n_heldout_per_level": 4},
    "pretrain": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "batch_size": 8, "lr": 0.01, "warmup_steps": 2, "max_steps": 30, "eval_every": 30,
                 "target_accuracy": [0.99, 1.0]},
    # format credit: the barely trained model gets mixed rewards, so the updates (and the resume) are not vacuous
    "rl": {"steps": 10, "prompts_per_step": 2, "group_size": 4, "eval_every": 5, "eval_n": 4, "checkpoint_every": 2,
           "format_credit": 0.5, "runs": ["bf16:bf16"]},
    "throughput": {"profiles": ["bf16"]}, "diagnostics": {"pairs": ["bf16:bf16"], "num_prompts": 4},
    "eval": {"profiles": ["bf16"]},
}


def _script(mode, *args, env, timeout=120):
    res = subprocess.run(["bash", str(SCRIPT), mode, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _rows(path):
    with open(path, newline="") as fh:
        return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in csv.DictReader(fh)]


@pytest.mark.slow
def test_start_status_stop_resume_collect(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "WORK": str(work), "CONFIG": str(config), "PYTHON": sys.executable, "CORES": "1",
           "GPU_SLOTS": "0", "OUT": str(out)}
    target = f"results/h200rltest/rl/{RUN}/summary.json"
    run = work / "repo" / "results" / "h200rltest" / "rl" / RUN
    t0 = time.monotonic()
    assert "started job" in _script("start", target, env=env)
    assert time.monotonic() - t0 < 60  # returns while the DAG runs
    deadline = time.monotonic() + 600
    while not (run / "state" / "state.pt").exists():  # the first checkpoint (step 2)
        assert time.monotonic() < deadline, _script("status", env=env)
        time.sleep(0.5)
    status = _script("status", env=env)
    assert "running for" in status and RUN in status
    assert "stopped job" in _script("stop", env=env)
    assert not (run / "summary.json").exists(), "the run finished before the stop: nothing resumed"
    assert "not running" in _script("status", env=env)

    _script("start", target, env=env)  # resumes: --rerun-incomplete, the run's state survives
    status = _script("wait", "600", env=env, timeout=700)
    assert "finished, exit 0" in status and "step 10/10  done" in status, status
    assert (out / "h200rltest-results.tgz").exists(), "the wait did not collect"
    log = (work / "repo" / "results" / "h200rltest" / "logs" / "rl" / f"{RUN}.log").read_text()
    assert "rl: 10 steps" in log

    straight = tmp_path / "straight"  # the same command, uninterrupted
    rl = {k: v for k, v in CONFIG["rl"].items() if k != "runs"}
    subprocess.run([sys.executable, "-m", "minite_core.cli", "rl", "--pretrained", str(run.parents[1] / "pretrain" /
                    "model"), "--data", str(run.parents[1] / "data"), "--out", str(straight), "--learner", "bf16",
                    "--sampler", "bf16", "--threads", "1", "--no-progress", "--experiment", "h200rltest",
                    "--config-json", json.dumps(rl)], check=True, cwd=ROOT, capture_output=True)
    resumed = _rows(run / "metrics.csv")
    assert resumed == _rows(straight / "metrics.csv") and len(resumed) == 10
    assert any(float(r["actor/grad_norm"]) > 0 for r in resumed)

    _script("collect", env=env)
    with tarfile.open(out / "h200rltest-results.tgz") as tar:
        names = tar.getnames()
    assert f"results/h200rltest/rl/{RUN}/metrics.csv" in names and f"results/h200rltest/rl/{RUN}/summary.json" in names
    assert not [n for n in names if n.endswith((".safetensors", ".pt")) or "/state" in n or "samples" in n]
    assert RUN in (out / "status.txt").read_text() and (out / "snakemake.log").exists()


def test_start_refuses_another_gpu(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "gpu_name": "H200"}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "WORK": str(tmp_path / "work"), "CONFIG": str(config), "PYTHON": sys.executable,
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", str(SCRIPT), "start"], check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and not (tmp_path / "work" / "repo").exists()
    assert res.stderr.strip().splitlines() == [
        f"h200_rl.sh: {config} is for H200 GPUs and this one is NVIDIA H100 80GB HBM3: run it on an H200 "
        "(ANY_GPU=1 runs it anyway)"]
