"""GRPO math: vectorised (_sut) vs loop reference (_ref) on random inputs, plus hand-checked cases."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from minite_core.rl.grpo import (
    AGG_MODES,
    CORRECTIONS,
    aggregate,
    aggregate_ref,
    group_advantages,
    group_advantages_ref,
    policy_loss,
    policy_loss_ref,
    rollout_correction,
)

ATOL = 1e-6  # float64 inputs; vectorised and loop sums differ only in summation order


def _random_batch(seed: int, N: int = 6, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3  # (N, T)
    logp_new = logp_old + 0.4 * torch.randn(N, T, generator=g, dtype=torch.float64)  # some tokens clip
    logp_sampler = logp_old + 0.8 * torch.randn(N, T, generator=g, dtype=torch.float64)  # some |log w| > log 2
    logp_sampler[3] += 1.2  # a sequence whose geometric-mean ratio is far below 1/2 (mis-seq rejects it)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    mask = torch.rand(N, T, generator=g) < 0.75
    mask[1] = False  # a fully masked row
    mask[2, :] = True
    logp_new[~mask] = 1e4  # garbage at padding must not leak
    return logp_new, logp_old, adv, mask, logp_sampler


# ----------------------------------------------------------------------------------------------- advantages
@pytest.mark.parametrize("norm_std", [True, False])
def test_group_advantages_matches_ref(norm_std):
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(4 * 8, generator=g, dtype=torch.float64) > 0.5).double()
    rewards[:8] = 1.0  # an all-equal group
    adv_sut = group_advantages(rewards, 8, norm_std=norm_std)
    adv_ref = torch.tensor(group_advantages_ref(rewards.tolist(), 8, norm_std=norm_std), dtype=torch.float64)
    torch.testing.assert_close(adv_sut, adv_ref, atol=ATOL, rtol=0)
    assert torch.all(adv_sut[:8] == 0)


def test_group_advantages_hand():
    adv = group_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0]), 2)
    s = 1 / (math.sqrt(0.5) + 1e-6)  # unbiased std of {0, 1} is sqrt(1/2)
    torch.testing.assert_close(adv, torch.tensor([-0.5 * s, 0.5 * s, 0.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(group_advantages(torch.tensor([0, 1]), 2, norm_std=False), torch.tensor([-0.5, 0.5]))
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4), 1)


# ----------------------------------------------------------------------------------------------- aggregate
def test_aggregate_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("inf"), 0.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)  # empty row excluded
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "token-mean", denom=10).item() == pytest.approx(1.0)
    assert aggregate(loss, torch.zeros(3, 3), "token-mean").item() == 0.0
    with pytest.raises(ValueError):
        aggregate(loss, mask, "sum")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_matches_ref_and_microbatches(mode):
    logp_new, _, _, mask, _ = _random_batch(1)
    loss = torch.randn(*mask.shape, dtype=torch.float64)
    torch.testing.assert_close(aggregate(loss, mask, mode),
                               torch.as_tensor(aggregate_ref(loss.tolist(), mask.tolist(), mode), dtype=torch.float64),
                               atol=ATOL, rtol=0)
    # gradient accumulation: micro-batch losses with the global denominator sum to the full-batch loss
    denom = mask.sum().item() if mode == "token-mean" else (mask.sum(-1) > 0).sum().item()
    parts = sum(aggregate(loss[i:i + 2], mask[i:i + 2], mode, denom=denom) for i in range(0, 6, 2))
    torch.testing.assert_close(parts, aggregate(loss, mask, mode), atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------- policy loss vs ref
@pytest.mark.parametrize("correction,agg_mode,clip_ratio_c",
                         list(itertools.product(CORRECTIONS, AGG_MODES, [None, 1.5])))
def test_policy_loss_matches_ref(correction, agg_mode, clip_ratio_c):
    for seed in range(3):
        logp_new, logp_old, adv, mask, logp_sampler = _random_batch(seed)
        kw = dict(correction=correction, logp_sampler=logp_sampler if correction else None, cap=2.0,
                  clip_ratio_c=clip_ratio_c, agg_mode=agg_mode)
        lp_sut = logp_new.clone().requires_grad_(True)
        loss_sut, met_sut = policy_loss(lp_sut, logp_old, adv, mask, 0.2, 0.28, **kw)
        loss_sut.backward()
        lp_ref = logp_new.clone().requires_grad_(True)
        loss_ref, met_ref = policy_loss_ref(lp_ref, logp_old, adv, mask, 0.2, 0.28, **kw)
        loss_ref.backward()
        torch.testing.assert_close(loss_sut.detach(), loss_ref.detach().to(torch.float64), atol=ATOL, rtol=0)
        torch.testing.assert_close(lp_sut.grad, lp_ref.grad, atol=ATOL, rtol=0)
        assert set(met_sut) == set(met_ref)
        for k in met_ref:
            assert float(met_sut[k]) == pytest.approx(met_ref[k], abs=ATOL), k
            assert "/" in k and not met_sut[k].requires_grad
        assert torch.all(lp_sut.grad[~mask] == 0)


def test_random_batch_exercises_branches():
    """Guard for the test above: over its seeds the random inputs clip, dual-clip, truncate and reject."""
    seen: dict[str, float] = {}
    for seed in range(3):
        logp_new, logp_old, adv, mask, logp_sampler = _random_batch(seed)
        for corr in CORRECTIONS[1:]:
            _, m = policy_loss(logp_new, logp_old, adv, mask, correction=corr, logp_sampler=logp_sampler,
                               clip_ratio_c=1.5)
            for k, v in m.items():
                seen[k] = max(seen.get(k, 0.0), float(v))
    for k in ("actor/clipfrac_high", "actor/clipfrac_low", "actor/clipfrac_dual", "actor/tis_clip_frac",
              "actor/mis_reject_frac", "actor/mis_seq_reject_frac"):
        assert 0 < seen[k] < 1, (k, seen[k])


# ----------------------------------------------------------------------------------------------- hand-checked
def _one_token(ratio: float, adv: float, **kw):
    lp_new = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss, met = policy_loss(lp_new, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64),
                            torch.ones(1, 1, dtype=torch.bool), 0.2, 0.28, **kw)
    loss.backward()
    return loss.item(), lp_new.grad.item(), met


@pytest.mark.parametrize("ratio,adv,loss,clipped,grad", [
    (1.5, 1.0, -1.28, "high", 0.0),    # A > 0, ratio above 1 + 0.28: clipped, no gradient
    (1.2, 1.0, -1.2, None, -1.2),      # inside the range: d(-A r)/d logp = -A r
    (0.5, 1.0, -0.5, None, -0.5),      # A > 0, ratio below 1 - 0.2: the lower clip does not bind
    (0.5, -1.0, 0.8, "low", 0.0),      # A < 0, ratio below 1 - 0.2: clipped at 0.8
    (1.5, -1.0, 1.5, None, 1.5),       # A < 0, ratio above 1 + 0.28: not clipped (no dual clip)
    (0.9, 0.0, 0.0, None, 0.0),        # zero advantage contributes nothing
])
def test_clipping_hand(ratio, adv, loss, clipped, grad):
    got_loss, got_grad, met = _one_token(ratio, adv)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad)
    assert met["actor/clipfrac"].item() == (clipped is not None)
    assert met["actor/clipfrac_high"].item() == (clipped == "high")
    assert met["actor/clipfrac_low"].item() == (clipped == "low")
    assert met["actor/ppo_kl"].item() == pytest.approx(-math.log(ratio))


def test_dual_clip_hand():
    got_loss, got_grad, met = _one_token(5.0, -1.0, clip_ratio_c=3.0)
    assert (got_loss, got_grad) == (pytest.approx(3.0), 0.0) and met["actor/clipfrac_dual"].item() == 1.0


def test_mask_handling_hand():
    lp_old = torch.zeros(2, 3, dtype=torch.float64)
    lp_new = torch.tensor([[math.log(1.1), 1e4, -1e4], [math.log(0.9), math.log(1.0), 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, met = policy_loss(lp_new, lp_old, adv, mask)
    assert loss.item() == pytest.approx((-1.1 + 2 * 0.9 + 2 * 1.0) / 3)
    assert met["actor/clipfrac"].item() == 0.0


def test_tis_hand():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    lp_sampler = torch.tensor([[-math.log(3.0), -math.log(1.5)]], dtype=torch.float64)  # w = 3 (capped to 2), 1.5
    ones = torch.ones(1, 2, dtype=torch.bool)
    lp_sampler_g = lp_sampler.clone().requires_grad_(True)
    lp_new = lp.clone().requires_grad_(True)
    loss, met = policy_loss(lp_new, lp, torch.tensor([1.0], dtype=torch.float64), ones,
                            correction="tis", logp_sampler=lp_sampler_g, cap=2.0)
    assert loss.item() == pytest.approx(-(2.0 + 1.5) / 2)
    assert met["actor/tis_weight_mean"].item() == pytest.approx(1.75)
    assert met["actor/tis_clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    assert lp_sampler_g.grad is None  # the weight is detached
    torch.testing.assert_close(lp_new.grad, torch.tensor([[-1.0, -0.75]], dtype=torch.float64))


def test_mis_token_and_seq_hand():
    lp_old = torch.zeros(2, 3, dtype=torch.float64)
    # row 0: ratios 3, 1.5, 1 -> geometric mean (4.5)^(1/3) = 1.65 (kept as a sequence; token 0 rejected alone)
    # row 1: ratios 3, 3, 0.9 -> geometric mean 2.08 > 2 (sequence rejected; tokens 0, 1 rejected alone)
    w = torch.tensor([[3.0, 1.5, 1.0], [3.0, 3.0, 0.9]], dtype=torch.float64)
    lp_sampler = -w.log()
    lp_new = torch.log(torch.tensor([[1.0, 1.1, 1.2], [1.0, 1.0, 1.05]], dtype=torch.float64))
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, met = policy_loss(lp_new, lp_old, adv, mask, correction="mis-token", logp_sampler=lp_sampler)
    assert loss.item() == pytest.approx(-(1.1 + 1.2 + 1.05) / 3)
    assert met["actor/mis_reject_frac"].item() == pytest.approx(3 / 6)
    loss, met = policy_loss(lp_new, lp_old, adv, mask, correction="mis-seq", logp_sampler=lp_sampler)
    assert loss.item() == pytest.approx(-(1.0 + 1.1 + 1.2) / 3)
    assert met["actor/mis_seq_reject_frac"].item() == pytest.approx(0.5)
    assert met["actor/mis_reject_frac"].item() == pytest.approx(0.5)
    # the bound is two-sided: a sampler that is 3x more confident than the learner is rejected too
    _, keep, _ = rollout_correction(torch.zeros(1, 1), torch.log(torch.tensor([[3.0]])), torch.ones(1, 1), "mis-token")
    assert not keep.any()


def test_policy_loss_errors():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        policy_loss(z, z, torch.zeros(1), z.bool(), correction="tis")  # no logp_sampler
    with pytest.raises(ValueError):
        policy_loss(z, z, torch.zeros(1), z.bool(), correction="is", logp_sampler=z)
