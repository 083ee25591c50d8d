"""What the kernel tests share: Triton in its CPU interpreter where no GPU is visible, the inputs with the edge cases
every quantizer must meet, and the bitwise comparison of two NVFP4 tensors (codes, scales and S_dec: atol=0)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
cpu_kernels = pytest.mark.skipif(not (INTERPRETED or CUDA),
                                 reason="triton imported before this module without TRITON_INTERPRET=1 and no GPU")


def same_bits(t_sut, t_ref, dq_sut=None, dq_ref=None):
    assert torch.equal(t_sut.data.cpu(), t_ref.data.cpu()), "codes differ"
    assert torch.equal(t_sut.scale.view(torch.uint8).cpu(), t_ref.scale.view(torch.uint8).cpu()), "scales differ"
    assert torch.equal(t_sut.global_scale.cpu(), t_ref.global_scale.cpu()), "global scales differ"
    if dq_sut is not None:
        assert torch.equal(dq_sut.cpu(), dq_ref.cpu()), "bf16 dequantized copy differs"


def kernel_input(m, k, dtype, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).mul(8).exp2()  # rows of varied amax
    x[0, :16] = 0.0  # an all-zero block
    if m > 1:
        x[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 6.0, 7.0, 1e-30, -3.5, 0.5, 1, 2])
    if m > 2:
        x[2] = 0.0  # an all-zero row (amax 0 -> S_enc 1)
    return x.to(dtype).to(device)
