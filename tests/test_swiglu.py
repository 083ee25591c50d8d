"""kernels/swiglu.py: silu(gate) * up in one launch each way against autograd through torch's ops
(`model.qwen3_moe.silu_mul` / `swiglu`). On the GPU the forward and dup are torch's bits and dgate within one bf16
rounding; on CPU (the interpreter's exp is numpy's) all within one rounding.

CPU: the interpreter on small shapes. GPU (`-m gpu`, the H200): the experts' [gate | up] at the learner bench's
shape (131,072 + padding rows x 2 x 768) and the dense MLP's two halves.
"""
from __future__ import annotations

import os

import pytest
import torch

from minite_core.kernels import dispatch
from minite_core.kernels.swiglu import SiluMul, SwiGLU
from minite_core.model.qwen3_moe import silu_mul, swiglu

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
triton_ok = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                               reason="needs a CUDA GPU or TRITON_INTERPRET=1")
BF16_ROUNDING = 2.0 ** -7  # one bf16 rounding, relative, with room for a tie


def _close(sut, ref, what, bitwise: bool):
    if bitwise:
        assert torch.equal(sut, ref), f"{what}: {int((sut != ref).sum())} of {sut.numel()} differ"
        return
    err = (sut.double() - ref.double()).abs()
    assert (err <= BF16_ROUNDING * ref.double().abs() + 1e-30).all(), f"{what}: worst {float(err.max()):.3g}"
    assert (err > 0).double().mean() < 0.01, f"{what}: {float((err > 0).double().mean()):.3%} differ"


def _check(rows: int, inter: int, device: str, fused_input: bool):
    g = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 4).bfloat16().to(device)
    dh = torch.randn(rows, inter, generator=g).bfloat16().to(device)
    outs = {}
    for who in ("ref", "sut"):
        if fused_input:
            x = gate_up.detach().clone().requires_grad_(True)
            h = swiglu(x) if who == "ref" else SwiGLU.apply(x)
            h.backward(dh)
            outs[who] = (h, *x.grad.chunk(2, dim=-1))
        else:
            gate, up = (t.detach().clone().requires_grad_(True) for t in gate_up.chunk(2, dim=-1))
            h = silu_mul(gate, up) if who == "ref" else SiluMul.apply(gate, up)
            h.backward(dh)
            outs[who] = (h, gate.grad, up.grad)
    for what, sut, ref, bit in zip(("h", "dgate", "dup"), outs["sut"], outs["ref"], (CUDA, False, CUDA)):
        _close(sut, ref, what, bit)


@triton_ok
@pytest.mark.parametrize("fused_input", [True, False])
def test_swiglu_equals_torch(fused_input):
    _check(37, 80, DEV, fused_input)  # 80: a ragged column block


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("rows,inter,fused_input", [(132_096, 768, True), (16_384, 6_144, False)])
def test_gpu_swiglu_learner_shapes(rows, inter, fused_input):
    _check(rows, inter, "cuda", fused_input)


@triton_ok
def test_dispatch_takes_the_kernel_on_the_fast_path_only():
    gate_up = torch.randn(4, 32, device=DEV).bfloat16().requires_grad_(True)
    with dispatch.using_backend("triton"):
        assert type(dispatch.swiglu(gate_up, reference=swiglu).grad_fn).__name__ == "SwiGLUBackward"
        gate, up = gate_up.chunk(2, dim=-1)
        assert type(dispatch.silu_mul(gate, up, reference=silu_mul).grad_fn).__name__ == "SiluMulBackward"
    with dispatch.using_backend("reference"):
        assert type(dispatch.swiglu(gate_up, reference=swiglu).grad_fn).__name__ == "MulBackward0"
