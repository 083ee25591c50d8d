"""runs/gpu_lease.py: the local DAG's jobs spread over a machine's GPUs, each lease held until its process ends."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from minite_core.runs import gpu_lease

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITE_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    yield tmp_path / "locks"
    gpu_lease.release()


def test_slots_spread_over_the_gpus_before_sharing_one(locks):
    got = [gpu_lease.try_lease(3, 2, locks) for _ in range(7)]
    assert got == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), None]
    gpu_lease.release()
    assert gpu_lease.try_lease(3, 2, locks) == (0, 0)


def test_a_killed_job_frees_its_gpu(locks):
    """The lease is the process's open lock: gone when the process is, however it ends."""
    code = ("import sys, time; from minite_core.runs import gpu_lease; "
            "print(gpu_lease.try_lease(2, 1, gpu_lease.lock_dir()), flush=True); time.sleep(60)")
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert job.stdout.readline().strip() == "(0, 0)"
        assert gpu_lease.try_lease(2, 1, locks) == (1, 0)  # GPU 0 is the other process's
        assert gpu_lease.try_lease(2, 1, locks) is None
    finally:
        job.kill()
        job.wait()
    assert gpu_lease.try_lease(2, 1, locks) == (0, 0)


def test_lease_shows_the_process_its_gpu_only(locks, monkeypatch, capsys):
    assert gpu_lease.try_lease(4, 1, locks) == (0, 0)  # another job holds GPU 0
    assert gpu_lease.lease("4x1") == 1
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "gpu lease: GPU 1 (slot 1 of 1)" in capsys.readouterr().err


def test_more_gpus_than_the_machine_has_is_one_line(locks, monkeypatch):
    monkeypatch.setattr(gpu_lease, "machine_gpus", lambda: 1)
    with pytest.raises(ValueError, match=r"--gpu-lease 8x2: this machine has 1 GPU\(s\), not 8; set `gpus: 1`"):
        gpu_lease.lease("8x2")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.parametrize("env", [{"LOCAL_RANK": "0"}, {"CUDA_VISIBLE_DEVICES": "3"}])
def test_torchrun_ranks_and_placed_jobs_are_left_alone(locks, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert gpu_lease.lease("8x2") is None
    assert not locks.exists()


def test_a_full_machine_waits_for_a_free_slot(locks, capsys):
    assert gpu_lease.try_lease(1, 1, locks) == (0, 0)
    held = list(gpu_lease._held)
    threading.Timer(0.3, lambda: [os.close(fd) or gpu_lease._held.remove(fd) for fd in held]).start()
    t0 = time.perf_counter()
    assert gpu_lease.lease("1x1", poll_s=0.05) == 0
    assert time.perf_counter() - t0 >= 0.25
    assert "all 1x1 slots" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["8", "0x2", "ax2", "8x2x1"])
def test_bad_spec_is_one_line(spec):
    with pytest.raises(ValueError, match=r"--gpu-lease .*: "):
        gpu_lease.parse(spec)


def test_cli_rejects_a_bad_spec_in_one_line():
    res = subprocess.run([sys.executable, "-m", "minite_core.cli", "quant-error", "--out", "x.json", "--device",
                          "cuda", "--gpu-lease", "8"], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 2
    assert "--gpu-lease '8': expected GxS" in res.stderr.strip().splitlines()[-1]
