"""The one-launch RoPE kernel (kernels/rope.py) against `apply_rope_reference`: bitwise (torch.equal) in
every mode of apply_rope — x's dtype (bf16, fp32), fp32 rope_dtype with RNE / RTZ back to bf16 — on decode (T=1)
and prefill shapes, Dh 32 / 128, odd B / H, and the transposed view Attention.forward passes. CPU: the Triton
interpreter (conftest); `-m gpu`: the compiled kernel on CUDA (where FMA contraction would show in fp32)."""
from __future__ import annotations

import pytest
import torch

from minite_core.kernels import dispatch
from minite_core.model import qwen3_moe
from minite_core.model.qwen3_moe import apply_rope, apply_rope_reference, rope_cos_sin

CUDA = torch.cuda.is_available()
# (x dtype, cos/sin dtype, rope dtype, rounding): every mode of apply_rope the profiles use, and fp32 throughout
MODES = [(torch.bfloat16, torch.bfloat16, None, "rne"), (torch.bfloat16, torch.bfloat16, torch.float32, "rne"),
         (torch.bfloat16, torch.bfloat16, torch.float32, "rtz"), (torch.float32, torch.float32, None, "rne"),
         (torch.bfloat16, torch.float32, torch.float32, "rtz"), (torch.float32, torch.float32, torch.bfloat16, "rne"),
         (torch.float16, torch.float16, None, "rne"), (torch.float16, torch.float16, torch.float32, "rne")]
SHAPES = [(3, 5, 1, 32), (2, 3, 7, 128), (1, 8, 13, 32)]  # (B, H, T, Dh): decode, prefill, odd sizes


def _operands(B, H, T, Dh, x_dtype, cs_dtype, device, seed=0):
    """x as Attention.forward builds it: a (B, T, H, Dh) tensor viewed (B, H, T, Dh) — non-contiguous."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, H, Dh, generator=g) * 3).to(device, x_dtype).transpose(1, 2)
    pos = torch.randint(0, 4000, (B, T), generator=g).to(device)
    cos, sin = rope_cos_sin(pos, Dh, 1e6, cs_dtype)  # (B, 1, T, Dh)
    return x, cos, sin


def _bits(t):  # torch.equal says -0.0 == +0.0; the bits do not
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _check(device):
    for shape in SHAPES:
        for x_dtype, cs_dtype, dtype, rounding in MODES:
            x, cos, sin = _operands(*shape, x_dtype, cs_dtype, device)
            for xv in (x, x.contiguous()):
                ref = apply_rope_reference(xv, cos, sin, dtype, rounding)
                with dispatch.using_backend("triton"):
                    sut = apply_rope(xv, cos, sin, dtype, rounding)
                case = (shape, x_dtype, cs_dtype, dtype, rounding, xv.is_contiguous())
                assert sut.dtype == ref.dtype and sut.shape == ref.shape, case
                assert torch.equal(_bits(sut), _bits(ref)), (case, int((_bits(sut) != _bits(ref)).sum()))


def test_rope_kernel_equals_reference_bitwise(monkeypatch):
    from minite_core.kernels import rope

    calls = []
    kernel = rope.rope_triton
    monkeypatch.setattr(rope, "rope_triton", lambda *a: calls.append(1) or kernel(*a))
    _check("cpu")
    assert len(calls) == 2 * len(SHAPES) * len(MODES)  # every case ran the kernel, none fell back


@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_rope_kernel_signed_zeros(dtype):
    """Hand case: x[0] = -0 (x1), x[2] = +0 (x2), cos = sin = 1: the reference's first half is (-0) + (-(+0)) = -0; Triton's
    `-x2` (0 - x2 = +0) would give +0 (the kernel subtracts instead)."""
    x = torch.tensor([-0.0, 1.0, 0.0, -2.0]).view(1, 1, 1, 4).to(torch.bfloat16)
    one = torch.ones(1, 1, 1, 4, dtype=torch.bfloat16)
    ref = apply_rope_reference(x, one, one, dtype)
    with dispatch.using_backend("triton"):
        sut = apply_rope(x, one, one, dtype)
    assert _bits(ref)[0, 0, 0, 0] == _bits(torch.tensor(-0.0, dtype=torch.bfloat16))  # the case is what it says
    assert torch.equal(_bits(sut), _bits(ref)), (sut, ref)


def test_rope_modes_differ():
    """The cases above can fail: RTZ, RNE and the per-op bf16 roundings give different bits on these operands."""
    x, cos, sin = _operands(2, 3, 7, 128, torch.bfloat16, torch.bfloat16, "cpu")
    outs = [apply_rope_reference(x, cos, sin, d, r) for d, r in ((None, "rne"), (torch.float32, "rne"),
                                                                  (torch.float32, "rtz"))]
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])


def test_rope_grad_and_reference_backend_run_the_reference(monkeypatch):
    """Autograd goes through the reference (the kernel is forward-only); the CPU default never reaches Triton."""
    from minite_core.kernels import rope

    monkeypatch.setattr(rope, "rope_triton", lambda *a: pytest.fail("kernel called"))
    x, cos, sin = _operands(2, 3, 4, 32, torch.float32, torch.float32, "cpu")
    xg = x.detach().requires_grad_()
    with dispatch.using_backend("triton"):
        apply_rope(xg, cos, sin).sum().backward()
    assert xg.grad is not None
    with dispatch.using_backend("reference"):
        assert torch.equal(apply_rope(x, cos, sin), qwen3_moe.apply_rope_reference(x, cos, sin))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_rope_kernel_equals_reference_bitwise():
    _check("cuda")
