"""The Snakemake DAG: every experiment dry-runs, an invalid config fails naming the key, the Slurm profile
dry-runs. (The smoke DAG itself runs end to end in .ci/run, twice: the second run must do nothing.)"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _dry_run(*args, cwd=ROOT):
    return subprocess.run([*SNAKEMAKE, "-n", "--quiet", "all", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("experiment", ["smoke", "h200", "paper-b300"])
def test_experiments_dry_run(experiment):
    res = _dry_run("--configfile", f"experiments/{experiment}.yaml")
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize(
    "yaml_text, key",
    [
        ("experiment: bad\ndevice: tpu\n", "device"),
        ("experiment: bad\nrl: {steps: 0}\n", "steps"),
        ("experiment: bad\nquant_error: {cols: 100}\n", "cols"),
        ("experiment: bad\ndiagnostics: {pairs: [bf16]}\n", "pairs"),
        ("experiment: bad\ndiagnostics: {budget: {'bf16:bf16': -1}}\n", "budget"),
        ("experiment: bad\nunknown_stage: {}\n", "unknown_stage"),
    ],
)
def test_invalid_config_names_the_key(tmp_path, yaml_text, key):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    res = _dry_run("--configfile", str(bad))
    assert res.returncode != 0
    assert key in res.stderr + res.stdout


def test_slurm_profile_dry_run():
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="optional extra `slurm` not installed")
    res = _dry_run("--workflow-profile", "workflow/profiles/slurm", "--configfile", "experiments/h200.yaml")
    assert res.returncode == 0, res.stderr[-2000:]


def test_ci_runs_the_dag_after_the_tests():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("test-command") < ci.index("snakemake --cores 2 --forceall")
    assert "Nothing to be done" in ci
    assert shutil.which("bash")
