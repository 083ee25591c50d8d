"""Recomputation in backward (nn.recompute: RMSNorm and SwiGLU save only their inputs): the same bits as the plain
autograd graph — loss, logits and every parameter gradient of a learner step, torch.equal — and fewer saved bytes,
counted by bench.saved_activations (which must still see the inputs a recomputed region keeps)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from minite_core.bench.learner_setup import CONFIGS, build
from minite_core.bench.saved_activations import saved_activation_bytes
from minite_core.model import set_profile
from minite_core.model.qwen3_moe import RMSNorm, swiglu
from minite_core.nn import recompute
from minite_core.nn.walk import set_sr_seeds
from minite_core.profiles import get_profile


@pytest.fixture(scope="module")
def tiny():
    """The learner bench's tiny CPU config: MoE, dense, MoE layers; fp32 masters; one fixed batch."""
    torch.manual_seed(0)
    model, _, input_ids, labels = build(CONFIGS["tiny"], torch.device("cpu"))
    return model, input_ids, labels


def _plain(profile):
    """The same profile with the knob off: the graph autograd builds by default."""
    return dataclasses.replace(get_profile(profile), recompute_elementwise=False)


def _step(model, input_ids, labels):
    """Forward + cross-entropy + backward (bench.learner.learner_step without the optimizer) -> (logits, loss,
    {name: grad})."""
    model.zero_grad(set_to_none=True)
    set_sr_seeds(model, 0, 3)  # SR streams: the same seeds for both runs
    logits = model(input_ids)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits.detach(), loss.detach(), grads


_BF16 = dataclasses.replace(get_profile("bf16"), name="bf16+recompute", recompute_elementwise=True)
PROFILES = (_BF16, "minite", "te-nvfp4", "minite-onpolicy",
            dataclasses.replace(_BF16, name="bf16+recompute+fused-add-norm", fused_add_norm=True))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p if isinstance(p, str) else p.name)
def test_learner_step_bitwise(tiny, profile):
    model, input_ids, labels = tiny
    set_profile(model, _plain(profile))
    logits_ref, loss_ref, grads_ref = _step(model, input_ids, labels)
    set_profile(model, profile)
    logits_sut, loss_sut, grads_sut = _step(model, input_ids, labels)
    assert torch.equal(logits_sut, logits_ref)
    assert torch.equal(loss_sut, loss_ref)
    assert grads_sut.keys() == grads_ref.keys()
    for name, g_ref in grads_ref.items():
        assert torch.equal(grads_sut[name], g_ref), name
    assert all(g.abs().sum() > 0 for name, g in grads_ref.items() if "norm" in name)  # the norms are in play


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("x_grad", [True, False])
def test_rmsnorm_bitwise(residual, x_grad):
    """One norm, plain and add-norm, with and without a gradient for x (weight: an fp32 master)."""
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(48, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(48, generator=gen))
    x = torch.randn(3, 5, 48, generator=gen).bfloat16()
    r = torch.randn(3, 5, 48, generator=gen).bfloat16() if residual else None
    dy = torch.randn(3, 5, 48, generator=gen).bfloat16()
    out = {}
    for plain in (True, False):
        xs = x.clone().requires_grad_(x_grad)
        rs = r.clone().requires_grad_() if residual else None
        norm.weight.grad = None
        norm.recompute = not plain  # profile knob recompute_elementwise
        y = norm(xs, rs)
        y.backward(dy)
        out[plain] = (y.detach(), norm.weight.grad, xs.grad, rs.grad if residual else None)
    for a, b in zip(out[False], out[True]):
        assert (a is None and b is None) or torch.equal(a, b)


def test_swiglu_bitwise():
    gen = torch.Generator().manual_seed(1)
    gate_up = torch.randn(40, 32, generator=gen).bfloat16()
    dy = torch.randn(40, 16, generator=gen).bfloat16()
    grads = []
    for plain in (True, False):
        x = gate_up.clone().requires_grad_()
        y = swiglu(x) if plain else recompute.recompute(swiglu, x)
        y.backward(dy)
        grads.append((y.detach(), x.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_no_grad_is_a_plain_call():
    x = torch.randn(4, 8).requires_grad_()
    with torch.no_grad():
        assert recompute.recompute(torch.sigmoid, x).grad_fn is None
    assert type(recompute.recompute(torch.sigmoid, x.detach())).__name__ == "Tensor"
    assert recompute.recompute(torch.sigmoid, x).grad_fn.name() == "_RecomputeBackward"


@pytest.mark.parametrize("residual", [False, True])
def test_norm_saves_only_its_inputs(residual):
    """bench.saved_activations counts what a recomputed norm keeps: its bf16 input(s), nothing else (the weight
    is a parameter); the plain graph keeps the fp32 upcast, the rsqrt and the normalised bf16 copy."""
    norm = RMSNorm(64, 1e-6)
    norm.recompute = True  # profile knob recompute_elementwise

    class Wrapped(torch.nn.Module):  # saved_activation_bytes calls model(input)
        def __init__(self):
            super().__init__()
            self.norm = norm

        def forward(self, x):
            return self.norm(x, x * 2 if residual else None)

    x = torch.randn(8, 64).bfloat16().requires_grad_()
    counted = saved_activation_bytes(Wrapped(), x)
    assert counted["total"] == x.numel() * 2 * (2 if residual else 1)
    norm.recompute = False
    plain = saved_activation_bytes(Wrapped(), x)
    assert plain["by_dtype"]["float32"] >= x.numel() * 4  # the fp32 upcast (or the fp32 sum)
    assert counted["total"] < plain["total"]


def test_tiny_model_saves_less(tiny):
    """The tiny bench model: no norm or SwiGLU intermediates left in the count, and fewer bytes in total for
    every profile that recomputes (measured at 589e179: bf16 976,640 -> 716,288 B; minite 722,300 -> 461,948 B);
    the bf16 profile itself keeps autograd's plain graph (recompute_elementwise=False)."""
    model, input_ids, _ = tiny
    for name, ratio in ((_BF16, 0.8), ("minite", 0.7), ("te-nvfp4", 0.7)):
        set_profile(model, _plain(name))
        plain = saved_activation_bytes(model, input_ids)
        set_profile(model, name)
        counted = saved_activation_bytes(model, input_ids)
        for producer in ("RsqrtBackward0", "SiluBackward0", "SplitBackward0"):
            assert producer in plain["by_producer"] and producer not in counted["by_producer"], (name, producer)
        assert counted["total"] < ratio * plain["total"], (name, counted["total"], plain["total"])
    set_profile(model, "bf16")
    assert "RsqrtBackward0" in saved_activation_bytes(model, input_ids)["by_producer"]
