"""kernels/rmsnorm_grad.py: the learner's RMSNorm (torch's mean, one-launch tail and backward) against autograd
through `RMSNorm.reference`. The forward bitwise on the GPU (on CPU the interpreter's rsqrt is 1/sqrt: within one
rounding, as tests/test_rmsnorm_tail.py); dx, the residual's gradient and dw within one rounding of bf16 (the two
sums, along a row and across rows, are added in another order).

CPU: the kernels run in Triton's interpreter (conftest) on small shapes. GPU (`-m gpu`, the H200): the learner's
shapes, a layer norm (16,384 x 2,048) and a head norm (16,384 tokens x 32 heads x 128).
"""
from __future__ import annotations

import os

import pytest
import torch

from minite_core.kernels import dispatch
from minite_core.kernels.rmsnorm_grad import FusedRMSNorm
from minite_core.model.qwen3_moe import RMSNorm

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
triton_ok = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                               reason="needs a CUDA GPU or TRITON_INTERPRET=1")
BF16_ROUNDING = 2.0 ** -7  # one bf16 rounding, relative, with room for a tie


def _case(shape, residual: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = (torch.randn(*shape, generator=g) * 3).bfloat16()
    r = torch.randn(*shape, generator=g).bfloat16() if residual else None
    w = 1 + 0.5 * torch.randn(D, generator=g)
    dy = torch.randn(*shape, generator=g).bfloat16()
    return x, r, w, dy


def _close(sut: torch.Tensor, ref: torch.Tensor, what: str):
    """Within one bf16 rounding of ref, elementwise, plus 2^-16 of the row's largest (a cancelling sum)."""
    sut, ref = sut.double().cpu(), ref.double().cpu()
    row_max = ref.abs().amax(-1, keepdim=True)
    err = (sut - ref).abs()
    bound = BF16_ROUNDING * ref.abs() + 2.0 ** -16 * row_max
    assert (err <= bound).all(), f"{what}: worst {float((err - bound).max()):.3g} over its bound"
    assert (err > 0).double().mean() < 0.01, f"{what}: {float((err > 0).double().mean()):.3%} of elements differ"


def _check(shape, residual: bool, device: str):
    x, r, w, dy = _case(shape, residual)
    norm = RMSNorm(shape[-1], 1e-6).to(device)
    with torch.no_grad():
        norm.weight.copy_(w)
    leaves = lambda: [t.detach().to(device).requires_grad_(True) if t is not None else None for t in (x, r)]  # noqa: E731

    x_ref, r_ref = leaves()
    w_ref = norm.weight.detach().clone().requires_grad_(True)
    y_ref = norm.reference(x_ref, w_ref, r_ref)
    y_ref.backward(dy.to(device))

    x_sut, r_sut = leaves()
    w_sut = norm.weight.detach().clone().requires_grad_(True)
    y_sut = FusedRMSNorm.apply(x_sut, w_sut, r_sut, norm.eps)
    y_sut.backward(dy.to(device))

    if CUDA:
        assert torch.equal(y_sut, y_ref)
    else:
        _close(y_sut, y_ref, "y")
    _close(x_sut.grad, x_ref.grad, "dx")
    if residual:
        _close(r_sut.grad, r_ref.grad, "dresidual")
    assert w_sut.grad.dtype == w_ref.grad.dtype == torch.float32
    _close(w_sut.grad, w_ref.grad, "dw")


@triton_ok
@pytest.mark.parametrize("shape,residual", [((37, 64), False), ((5, 80), True), ((2, 3, 4, 128), False)])
def test_fused_rmsnorm_equals_autograd_through_reference(shape, residual):
    """A row-tail that is not a power of two (80), a residual, a head norm's 4-D input."""
    _check(shape, residual, DEV)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("shape", [(16384, 2048), (4, 4096, 32, 128)])
def test_gpu_fused_rmsnorm_learner_shapes(shape):
    _check(shape, False, "cuda")


@triton_ok
def test_module_takes_the_fused_norm_with_gradient_only():
    """Grad mode on the fast path: the fused Function; the reference backend: autograd through the torch ops."""
    norm = RMSNorm(64, 1e-6).to(DEV)
    x = torch.randn(3, 64, device=DEV).bfloat16().requires_grad_(True)
    with dispatch.using_backend("triton"):
        assert type(norm(x).grad_fn).__name__ == "FusedRMSNormBackward"
        with torch.no_grad():
            assert norm(x).grad_fn is None
    with dispatch.using_backend("reference"):
        assert type(norm(x).grad_fn).__name__ != "FusedRMSNormBackward"
