"""`minite bench learner` under torchrun times the scale-out learner (bench.learner_dist) and reports
per-GPU and total tokens/s and the scaling efficiency against the plain learner measured in the same invocation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minite_core.bench import learner_dist as LD
from minite_core.bench.learner_setup import CONFIGS

ROOT = Path(__file__).resolve().parents[1]


def test_rows_take_the_slowest_rank_and_the_plain_baseline():
    cfg = CONFIGS["tiny"].__class__(name="t", batch=2, seq=32, profiles=("bf16",))
    ranks = [{"bf16": [10.0, 30.0, 10.0]}, {"bf16": [20.0, 10.0, 20.0]}]  # ms per step; slowest: 20, 30, 20
    (row,) = LD.rows(cfg, 2, ranks, [{}, {}], {"bf16": [16.0, 16.0, 16.0]})
    assert row["step_ms"] == 20.0 and row["n_steps"] == 3
    assert row["tokens_per_s"] == pytest.approx(2 * 64 / 0.020)
    assert row["per_gpu_tokens_per_s"] == pytest.approx(64 / 0.020)
    assert row["plain_tokens_per_s"] == pytest.approx(64 / 0.016)
    assert row["scaling_efficiency"] == pytest.approx(16 / 20)
    (row,) = LD.rows(cfg, 2, ranks, [{}, {}], None)
    assert row["plain_tokens_per_s"] is None and row["scaling_efficiency"] is None


def test_torchrun_two_ranks_measures_dist_and_plain(tmp_path):
    """torchrun --nproc-per-node 2 on the tiny MoE (experts expert-parallel, FSDP2, gloo): rank 0 writes one
    result with both measurements; every number is derived from timed steps."""
    out = tmp_path / "dist.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "minite_core.cli", "bench", "learner", "--config", "tiny", "--profiles", "bf16",
                          "--warmup", "1", "--iters", "3", "--out", str(out), "--csv", str(tmp_path / "dist.csv")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    payload = json.loads(out.read_text())
    c = payload["config"]
    assert c["world_size"] == 2 and c["tokens_per_step"] == 2 * c["batch"] * c["seq"]
    assert c["baseline"].startswith("plain pg_step(dp=None)")
    for row in payload["rows"]:
        assert row["n_steps"] == 3
        assert row["tokens_per_s"] == pytest.approx(c["tokens_per_step"] / (row["step_ms"] / 1e3))
        assert row["per_gpu_tokens_per_s"] == pytest.approx(row["tokens_per_s"] / 2)
        plain = c["batch"] * c["seq"] / (row["plain_step_ms"] / 1e3)
        assert row["plain_tokens_per_s"] == pytest.approx(plain) and plain > 0
        assert row["scaling_efficiency"] == pytest.approx(row["tokens_per_s"] / (2 * plain))
    assert "scaling efficiency" in res.stdout
    from minite_core.report.tables import throughput_table

    assert "Scale-out learner: 2 ranks × 2 rows" in throughput_table(payload)  # the report reads the result


def test_experiment_knows_the_bench_models_experts():
    """experiment.BENCH_EXPERTS (the gpus_per_job check, which cannot import the model) matches the bench."""
    from minite_core.experiment import BENCH_CONFIGS, BENCH_EXPERTS

    assert set(BENCH_EXPERTS) == set(BENCH_CONFIGS) == set(CONFIGS)
    for name, n in BENCH_EXPERTS.items():
        assert CONFIGS[name].model_config().num_experts == n
