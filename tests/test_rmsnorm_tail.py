"""kernels/rmsnorm_tail.py: RMSNorm without a gradient from its inputs (`rms_norm_nograd`: squares, torch's mean,
the tail) and after torch's mean (`rms_norm_tail`, where the inputs are not contiguous) == `RMSNorm.reference` —
bitwise on the GPU (`-m gpu`; CUDA's rsqrtf in both), within one output rounding under the CPU interpreter (numpy's
1/sqrt there)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minite_core.kernels import dispatch  # noqa: E402
from minite_core.model.qwen3_moe import RMSNorm  # noqa: E402

CUDA = torch.cuda.is_available()
CASES = [(256, torch.bfloat16), (32, torch.bfloat16), (48, torch.float32), (2048, torch.float16)]


# rms_norm_nograd on: contiguous x, every other row, the heads of a q|k|v-style column slice, a residual of another
# dtype; the tail after torch's ops on: a transposed x (its last dim not contiguous)
LAYOUTS = ["contiguous", "strided", "heads-slice", "fp32-residual", "transposed"]


def _pair(D, dtype, device, residual: bool, layout: str = "contiguous"):
    gen = torch.Generator().manual_seed(D)
    norm = RMSNorm(D, 1e-6).to(device)
    norm.weight.data = (torch.randn(D, generator=gen) * 0.3 + 1).to(device)
    x = (torch.randn(3, 5, D, generator=gen) * 3).to(dtype).to(device)
    res = torch.randn(3, 5, D, generator=gen).to(device) if residual else None
    res = res.to(dtype) if res is not None and layout != "fp32-residual" else res
    if layout == "strided":  # every other row: not contiguous
        x = torch.cat([x, x], dim=1)[:, ::2]
    elif layout == "heads-slice":  # (3, 5 heads, D) out of rows of 6·D
        x = torch.cat([x.reshape(3, 5 * D), x[:, 0]], dim=1)[:, :5 * D].view(3, 5, D)
    elif layout == "transposed":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert x.is_contiguous() == (layout in ("contiguous", "fp32-residual"))
    with torch.no_grad():
        with dispatch.using_backend("reference"):
            ref = norm(x, res)
        with dispatch.using_backend("triton"):
            fast = norm(x, res)
    return ref, fast


@pytest.mark.skipif(CUDA, reason="the interpreter check; the GPU runs the bitwise one")
@pytest.mark.parametrize("D,dtype", CASES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tail_matches_reference_in_the_interpreter(D, dtype, residual, layout):
    ref, fast = _pair(D, dtype, "cpu", residual, layout)
    assert fast.dtype == ref.dtype and fast.shape == ref.shape
    torch.testing.assert_close(fast, ref, rtol=2 ** -7, atol=0)  # one rounding of the output at most
    assert (fast == ref).float().mean() > 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_squares_equal_the_references_upcast_and_pow_bitwise(dtype):
    """The first launch of `rms_norm_nograd`: (x.float() + residual.float()).pow(2), bit for bit (an exact upcast,
    one fp32 add, one multiply: no rsqrt, so also under the interpreter), so torch's mean sees the same tensor."""
    from minite_core.kernels.rmsnorm_tail import squares

    device = "cuda" if CUDA else "cpu"
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(7, 96, generator=gen) * 40).to(dtype).to(device)
    for res in (None, torch.randn(7, 96, generator=gen).to(dtype).to(device),
                torch.randn(7, 96, generator=gen).to(device)):
        ref = (x.float() if res is None else x.float() + res.float()).pow(2)
        assert torch.equal(squares(x, res), ref)
    heads = torch.cat([x, x], dim=1)[:, :160].view(7, 10, 16)  # a column slice: heads of 16, rows 192 apart
    assert torch.equal(squares(heads), heads.float().pow(2))
    assert torch.equal(squares(heads).mean(-1), heads.float().pow(2).mean(-1))  # torch's mean: the same tensor


def test_nograd_path_takes_contiguous_inputs_only(monkeypatch):
    """RMSNorm without a gradient runs `rms_norm_nograd` (three launches, no fp32 copy of x) on the inputs
    `row_groups` takes (contiguous, column slices); another view, a gradient or the reference backend leave it to
    the reference (with the tail on the fast path)."""
    from minite_core.kernels.rmsnorm_tail import row_groups

    qkv = torch.randn(2, 1, 8 * 16)
    assert row_groups(qkv[..., :64].view(2, 1, 4, 16)) == (4, 128)  # q of a q|k|v output: 4 heads, rows 128 apart
    assert row_groups(torch.randn(6, 20)[:, :8]) == (1, 20) and row_groups(torch.randn(3, 5, 8)) == (15, 0)
    assert row_groups(torch.randn(8, 6).t()) is None
    from minite_core.kernels import rmsnorm_tail

    calls = []
    monkeypatch.setattr(rmsnorm_tail, "rms_norm_nograd",
                        lambda *a: calls.append(a[0].shape) or torch.zeros_like(a[0]))
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(4, 16)
    with torch.no_grad(), dispatch.using_backend("triton"):
        norm(x)
        norm(torch.randn(4, 16, 2)[..., 0])  # a view whose last dim is not contiguous
    with torch.no_grad(), dispatch.using_backend("reference"):
        norm(x)
    with dispatch.using_backend("triton"):
        norm(x)  # a gradient flows to the weight: the learner's path
    assert calls == [(4, 16)]


def test_tail_is_skipped_when_a_gradient_flows():
    x = torch.randn(4, 8)
    w = torch.ones(8, requires_grad=True)
    with dispatch.using_backend("triton"):
        assert dispatch.rms_norm_tail(x, x.pow(2).mean(-1, keepdim=True), w, 1e-6, torch.float32) is None
        with torch.no_grad():
            assert dispatch.rms_norm_tail(x, x.pow(2).mean(-1, keepdim=True), w, 1e-6, torch.float32) is not None
    assert dispatch.rms_norm_tail(x, x, w.detach(), 1e-6, torch.float32, backend="reference") is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("D,dtype", CASES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tail_bitwise_on_gpu(D, dtype, residual, layout):
    ref, fast = _pair(D, dtype, "cuda", residual, layout)
    assert torch.equal(fast, ref)
