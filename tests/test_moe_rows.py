"""The MoE row kernels (kernels/moe_rows.py) against their torch references (nn.moe_layout): permute and its
backward, combine and its dy bit for bit, combine's router gradient within its summation order.

CPU: the kernels run in Triton's interpreter (conftest) on small shapes. GPU (`-m gpu`, the H200): compiled, at one
8-GPU node rank's MoE shape (4,096 tokens, k = 8, D = 2,048).
"""
from __future__ import annotations

import os

import pytest
import torch

from minite_core.kernels import moe_rows
from minite_core.nn.moe_layout import combine_reference, moe_layout_reference, permute_reference

CUDA = torch.cuda.is_available()
triton_ok = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                               reason="needs a CUDA GPU or TRITON_INTERPRET=1")
# dtop_w: both sides round the same products; they add them in another order, in fp32. Against the fp64 sum of the
# rounded products, relative to the sum of their magnitudes: fp32 (fp32 router) or one bf16 rounding (bf16 router)
TOL_DW = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -7}
SMALL = dict(tokens=37, k=4, experts=6, hidden=1030)  # hidden: two column blocks, the second ragged
NODE_RANK = dict(tokens=4096, k=8, experts=16, hidden=2048)


def _case(tokens, k, experts, hidden, y_dtype, w_dtype, seed=0):
    """On the CPU: the layout of a random routing, x, y_pad, top_w and an fp32 output gradient."""
    g = torch.Generator().manual_seed(seed)
    top_idx = torch.rand(tokens, experts, generator=g).topk(k, dim=-1).indices
    layout = moe_layout_reference(top_idx, experts)
    x = torch.randn(tokens, hidden, generator=g).to(y_dtype)
    y_pad = torch.randn(layout.num_rows, hidden, generator=g).to(y_dtype)
    top_w = torch.rand(tokens, k, generator=g).softmax(-1).to(w_dtype)
    grad = torch.randn(tokens, hidden, generator=g) * torch.exp2(torch.randint(-8, 8, (tokens, 1), generator=g))
    return top_idx, layout, x, y_pad, top_w, grad


def _leaves(*ts, device="cpu"):
    return [t.detach().to(device).requires_grad_(True) for t in ts]


def _check(device, shape, y_dtype, w_dtype):
    """The references run on the CPU, where torch sums over k in rank order. torch's CUDA reduction does not
    (on the H200 its (N, k, D).sum(1) differed from the rank-order sum: results/h200/extra/moe-rows-rmsnorm-swiglu), so the
    kernels are held to the CPU's bits."""
    top_idx, layout, x, y_pad, top_w, grad = _case(**shape, y_dtype=y_dtype, w_dtype=w_dtype)
    lay = moe_layout_reference(top_idx.to(device), shape["experts"])  # the same layout, on the kernels' device

    # permute: the rows and the rank-order sum of their gradients, bitwise
    (x_ref,), (x_sut,) = _leaves(x), _leaves(x, device=device)
    xp_ref, xp_sut = permute_reference(x_ref, layout), moe_rows.Permute.apply(x_sut, lay.src, lay.dest)
    assert torch.equal(xp_sut.cpu(), xp_ref)
    xp_ref.backward(y_pad)
    xp_sut.backward(y_pad.to(device))
    assert torch.equal(x_sut.grad.cpu(), x_ref.grad)

    # combine: the output and dy bitwise, dw within its summation order
    (y_ref, w_ref), (y_sut, w_sut) = _leaves(y_pad, top_w), _leaves(y_pad, top_w, device=device)
    out_ref = combine_reference(y_ref, w_ref, layout)
    out_sut = moe_rows.Combine.apply(y_sut, w_sut, lay.dest, lay.src)
    assert out_sut.dtype == torch.float32
    assert torch.equal(out_sut.cpu(), out_ref)
    with torch.no_grad():  # decode: the kernel rounds its fp32 sum to the activation dtype itself
        low = moe_rows.rank_sum(y_sut, lay.dest, w_sut, y_dtype)
    assert low.dtype == y_dtype and torch.equal(low.cpu(), out_ref.detach().to(y_dtype))
    out_ref.backward(grad)
    out_sut.backward(grad.to(device))
    assert y_sut.grad.dtype == y_dtype and w_sut.grad.dtype == w_dtype
    assert torch.equal(y_sut.grad.cpu(), y_ref.grad)  # pad rows zero in both
    p = torch.promote_types(y_dtype, w_dtype)
    terms = (grad.to(p)[:, None, :] * y_pad[layout.dest].to(p)).double()  # the rounded products (N, k, D)
    exact, mag = terms.sum(-1), terms.abs().sum(-1)
    for dw in (w_sut.grad.cpu(), w_ref.grad):
        err = (dw.double() - exact).abs()
        assert (err <= TOL_DW[p] * mag + 1e-30).all(), float((err / mag).max())


@triton_ok
@pytest.mark.parametrize("y_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.float32, torch.float32)])
def test_moe_rows_equal_references(y_dtype, w_dtype):
    _check("cuda" if CUDA else "cpu", SMALL, y_dtype, w_dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_gpu_moe_rows_equal_references_node_rank_shape(w_dtype):
    _check("cuda", NODE_RANK, torch.bfloat16, w_dtype)


@triton_ok
def test_combine_output_does_not_depend_on_other_tokens():
    """Batch invariance: a token's combined row is the same bits alone as among many (one program per row)."""
    device = "cuda" if CUDA else "cpu"
    _, layout, _, y_pad, top_w, _ = _case(**SMALL, y_dtype=torch.bfloat16, w_dtype=torch.float32)
    y_pad, top_w, dest, src = (t.to(device) for t in (y_pad, top_w, layout.dest, layout.src))
    full = moe_rows.Combine.apply(y_pad, top_w, dest, src)
    some = moe_rows.Combine.apply(y_pad, top_w[5:9], dest[5:9], src)
    assert torch.equal(some, full[5:9])
