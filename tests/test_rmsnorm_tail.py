"""kernels/rmsnorm_tail.py: RMSNorm after torch's mean in one launch == `RMSNorm.reference` — bitwise on the GPU
(`-m gpu`; CUDA's rsqrtf in both), within one output rounding under the CPU interpreter (numpy's 1/sqrt there)."""
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


def _pair(D, dtype, device, residual: bool):
    gen = torch.Generator().manual_seed(D)
    norm = RMSNorm(D, 1e-6).to(device)
    norm.weight.data = (torch.randn(D, generator=gen) * 0.3 + 1).to(device)
    x = (torch.randn(3, 5, D, generator=gen) * 3).to(dtype).to(device)
    res = torch.randn(3, 5, D, generator=gen).to(dtype).to(device) if residual else None
    with torch.no_grad():
        with dispatch.using_backend("reference"):
            ref = norm(x, res)
        with dispatch.using_backend("triton"):
            fast = norm(x, res)
    return ref, fast


@pytest.mark.skipif(CUDA, reason="the interpreter check; the GPU runs the bitwise one")
@pytest.mark.parametrize("D,dtype", CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_tail_matches_reference_in_the_interpreter(D, dtype, residual):
    ref, fast = _pair(D, dtype, "cpu", residual)
    assert fast.dtype == ref.dtype and fast.shape == ref.shape
    torch.testing.assert_close(fast, ref, rtol=2 ** -7, atol=0)  # one rounding of the output at most
    assert (fast == ref).float().mean() > 0.99


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
def test_tail_bitwise_on_gpu(D, dtype, residual):
    ref, fast = _pair(D, dtype, "cuda", residual)
    assert torch.equal(fast, ref)
