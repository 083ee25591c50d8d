"""The DAG follows its inputs and outlives a kill:
- a changed parameter or input path reruns exactly the rules it feeds, also without Snakemake's provenance records
  (a fresh clone's committed results): checked with dry runs of the smoke config on a copy of the project;
- a SIGKILLed snakemake takes its running `minite` job with it, and the next `snakemake` runs without --unlock or
  --rerun-incomplete (runs/workflow.py), on a real run of the DAG's first rule."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _project(tmp_path: Path, results: bool = True) -> Path:
    """A copy of the workflow (Snakefile, rules, schema, experiments) and of the committed smoke results."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("Snakefile", "workflow", "experiments", "environment.yml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, proj / name)
    if results:
        shutil.copytree(ROOT / "results" / "smoke", proj / "results" / "smoke", copy_function=shutil.copy)
    return proj


def _snakemake(proj: Path, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*SNAKEMAKE, *args], cwd=proj, capture_output=True, text=True, timeout=timeout, env=env)


def _planned(proj: Path, config: Path) -> set[str]:
    res = _snakemake(proj, "-n", "--configfile", str(config))
    assert res.returncode == 0, res.stderr[-3000:]
    if "Nothing to be done" in res.stdout + res.stderr:
        return set()
    return set(re.findall(r"^(?:local)?rule (\w+):", res.stdout + res.stderr, flags=re.M))


def _config(proj: Path, name: str, **changes) -> Path:
    """The smoke config with `section.key: value` changes (double underscore for the dot)."""
    cfg = yaml.safe_load((proj / "experiments" / "smoke.yaml").read_text())
    for key, value in changes.items():
        section, field = key.split("__")
        cfg[section][field] = value
    path = proj / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_a_changed_input_reruns_what_it_feeds_without_provenance(tmp_path):
    if not (ROOT / "results" / "smoke" / "report.md").is_file():
        pytest.skip("needs the committed results/smoke/ (restore it: git checkout -- results/smoke)")
    proj = _project(tmp_path)
    res = _snakemake(proj, "--touch", "--cores", "1")  # the committed outputs, up to date in DAG order
    assert res.returncode == 0, res.stderr[-3000:]
    shutil.rmtree(proj / ".snakemake" / "metadata")  # as in a fresh clone: no provenance to compare against
    smoke = proj / "experiments" / "smoke.yaml"
    assert _planned(proj, smoke) == set()
    stamps = proj / "results" / "smoke" / "params"
    saved = tmp_path / "params"
    shutil.copytree(stamps, saved)  # (copy2: mtimes kept, to undo each dry run's stamp)
    (proj / "ckpt").mkdir()
    cases = {  # an input path the config names; a parameter (not the kernels check: another lr runs no new kernel)
        "checkpoint": (dict(diagnostics__checkpoint=str(proj / "ckpt")), {"diagnostics", "report", "all"}),
        "lr": (dict(rl__lr=3e-4), {"rl", "rl_figures", "eval_checkpoint", "diagnostics_external", "report", "all"}),
    }
    for name, (changes, expected) in cases.items():
        assert _planned(proj, _config(proj, name, **changes)) == expected, name
        shutil.rmtree(stamps)
        shutil.copytree(saved, stamps)
    assert _planned(proj, smoke) == set()


def _children_of(workflow_pid: int) -> list[int]:
    """Processes of `minite` jobs of that workflow: they carry its pid in $MINITE_WORKFLOW_PID."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"MINITE_WORKFLOW_PID={workflow_pid}".encode() in env and b"minite" in cmd and b"bash" not in cmd:
            out.append(int(proc.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]) != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_killed_workflow_stops_its_job_and_blocks_nothing(tmp_path):
    proj = _project(tmp_path, results=False)
    big = _config(proj, "big", data__n_train_per_level=1_000_000, data__levels=["add5"])
    big.write_text(big.read_text().replace("experiment: smoke", "experiment: killed"))
    target = "results/killed/data/data.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workflow = subprocess.Popen([*SNAKEMAKE, target, "--cores", "1", "--configfile", str(big)], cwd=proj, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, jobs = time.time() + 120, []
        while not jobs and time.time() < deadline:
            time.sleep(0.5)
            jobs = _children_of(workflow.pid)
        assert jobs, "the data job never started"
        time.sleep(3)  # the job is past its imports: its watcher runs
        workflow.send_signal(signal.SIGKILL)
        workflow.wait()
        deadline = time.time() + 15
        while any(map(_alive, jobs)) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(map(_alive, jobs)), "the job outlived its workflow"
        assert list((proj / ".snakemake" / "locks").glob("*.lock")), "no stale lock to clear: the test proves nothing"
    finally:
        for pid in _children_of(workflow.pid):
            os.kill(pid, signal.SIGKILL)
        workflow.kill()
    small = _config(proj, "small", data__n_train_per_level=64)
    small.write_text(small.read_text().replace("experiment: smoke", "experiment: killed"))
    res = _snakemake(proj, target, "--cores", "1", "--configfile", str(small))  # no --unlock, no --rerun-incomplete
    assert res.returncode == 0, res.stderr[-3000:]
    assert (proj / target).exists()
