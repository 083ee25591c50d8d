"""NeMo-RL's and verl's mismatch metrics (engines.framework_metrics) against values computed by hand from their
definitions, and the vectorised functions against the loop reference."""
import math

import pytest
import torch

from minite_core.engines.framework_metrics import (
    KEYS, framework_metrics, framework_metrics_ref, metric_key, nemo_rl_metrics, verl_metrics)

L2 = math.log(2.0)


def _two_tokens():
    """learner (prev / old) p = 0.5, 0.25; sampler (generation / rollout) p = 0.25, 0.25: Δ = ln 2, 0."""
    learner = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    sampler = torch.tensor([[math.log(0.25), math.log(0.25)]], dtype=torch.float64)
    return learner, sampler, torch.ones(1, 2, dtype=torch.bool)


def test_nemo_rl_by_hand():
    m = nemo_rl_metrics(*_two_tokens())
    n = 2 + 1e-8  # NeMo-RL's masked_mean: sum / (tokens + 1e-8)
    assert m["train/gen_kl_error"] == pytest.approx((2 - 1 - L2) / n, rel=1e-12)  # e^Δ − 1 − Δ, Δ = prev − gen
    assert m["train/policy_kl_error"] == pytest.approx((0.5 - 1 + L2) / n, rel=1e-12)
    assert m["train/token_mult_prob_error"] == pytest.approx((2 + 1) / n, rel=1e-12)  # mean e^|Δ|
    # JS, token 1: M = (0.5 + 0.25) / 2; terms e^(p − log M) − (p − log M) − 1 for p = prev, gen; token 2: 0
    a, b = 0.5 / 0.375, 0.25 / 0.375
    assert m["train/js_divergence_error"] == pytest.approx(
        (0.5 * (a - 1 - math.log(a)) + 0.5 * (b - 1 - math.log(b))) / n, rel=1e-12)


def test_verl_by_hand():
    m = verl_metrics(*_two_tokens())
    n = 2 + 1e-8  # verl_F.masked_mean: sum / (count + 1e-8)
    assert m["rollout_corr/kl"] == pytest.approx(-L2 / n, rel=1e-12)  # mean(rollout − old)
    assert m["rollout_corr/k3_kl"] == pytest.approx((2 - L2 - 1) / n, rel=1e-12)
    assert m["rollout_corr/chi2_token"] == pytest.approx((4 + 1) / n - 1, rel=1e-12)
    assert m["rollout_corr/chi2_seq"] == pytest.approx(math.exp(2 * L2) - 1, rel=1e-12)  # one row: (Π ρ)² − 1
    row_old, row_rollout = -3 * L2 / n, -4 * L2 / n  # row means of the log-probs
    assert m["rollout_corr/training_ppl"] == pytest.approx(math.exp(-row_old), rel=1e-12)
    assert m["rollout_corr/rollout_ppl"] == pytest.approx(math.exp(-row_rollout), rel=1e-12)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(row_rollout - row_old, rel=1e-12)
    assert m["rollout_corr/ppl_ratio"] == pytest.approx(math.exp(row_rollout - row_old), rel=1e-12)


def test_clamps_where_the_frameworks_clamp():
    """A token 30 nats apart: verl's chi2 clamps the log-ratio at 20, its k3_kl and NeMo-RL's gen_kl_error do not."""
    learner, sampler, mask = torch.tensor([[0.0]]), torch.tensor([[-30.0]]), torch.ones(1, 1, dtype=torch.bool)
    m = framework_metrics(learner, sampler, mask)
    assert m["rollout_corr/chi2_token"] == pytest.approx(math.exp(40) / (1 + 1e-8) - 1, rel=1e-9)
    assert m["rollout_corr/k3_kl"] == pytest.approx((math.exp(30) - 31) / (1 + 1e-8), rel=1e-9)
    assert m["train/gen_kl_error"] == pytest.approx((math.exp(30) - 31) / (1 + 1e-8), rel=1e-9)


def test_vectorised_equals_the_loop_reference():
    g = torch.Generator().manual_seed(3)
    sampler = -torch.rand(5, 9, generator=g, dtype=torch.float64) * 3
    learner = sampler + 0.2 * torch.randn(5, 9, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 9, generator=g) < 0.7
    mask[2] = False  # a row with no counted token: verl still averages its (zero) row means
    sut, ref = framework_metrics(learner, sampler, mask), framework_metrics_ref(learner, sampler, mask)
    assert set(sut) == set(ref) == set(KEYS)
    for k in KEYS:
        assert sut[k] == pytest.approx(ref[k], rel=1e-12, abs=1e-15), k
    empty = framework_metrics(learner, sampler, torch.zeros_like(mask))
    assert all(math.isnan(v) for v in empty.values())


def test_metric_names_users_gate_on():
    assert metric_key("gen_kl_error") == "train/gen_kl_error"
    assert metric_key("mismatch_k3_kl") == metric_key("mismatch/mismatch_k3_kl") == "rollout_corr/k3_kl"
    assert metric_key("k3") == "mismatch/k3" and metric_key("rollout_corr/kl") == "rollout_corr/kl"
