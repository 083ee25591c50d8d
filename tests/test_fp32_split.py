"""fp32 GEMMs on bf16 tensor cores (nn/fp32_split.py): the one-launch split (kernels/split3.py) against the torch
reference (`formats.bf16x3.split3`) bit for bit, and Fp32SplitLinear's grouped GEMMs against one GEMM a term
(`mm_split`, the plain form) and the fp64 product.

CPU: the kernel runs in Triton's interpreter (conftest) on small shapes. GPU (`-m gpu`, the H200): compiled, with
cuBLAS reading the weight pieces as strided prefixes of [W_1 | W_2 | W_3].
"""
from __future__ import annotations

import os

import pytest
import torch

from minite_core.formats.bf16x3 import split3
from minite_core.kernels import dispatch
from minite_core.nn.fp32_split import Fp32SplitLinear, mm_split

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
triton_ok = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                               reason="needs a CUDA GPU or TRITON_INTERPRET=1")
# against the fp64 product: fp32 accumulation order (and dropped terms below 2^-24) on CPU; on the GPU the tensor
# cores' accumulation loses low bits on every add (kernel check's GEMM tolerance), and the grouped GEMMs may not lose
# much more than one GEMM a term does on the same device
TOL = {"rel": 1e-6, "rel_gpu": 1e-5, "vs_plain": 1.5}


def _values(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random fp32 over 2^-60..2^60 with both signs, plus zeros, exact bf16 values and values one ulp off them."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-60, 60, (rows, cols), generator=g).float())
    flat = t.view(-1)
    flat[::7] = 0.0
    flat[1::11] = flat[1::11].bfloat16().float()
    flat[2::13] = torch.nextafter(flat[2::13].bfloat16().float(), torch.tensor(float("inf")))
    return t


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().contiguous().view(torch.int16)


@triton_ok
@pytest.mark.parametrize("shape", [(5, 37), (3, 1030)])
def test_split3_kernel_equals_reference(shape):
    """Both layouts, a column count that is not a multiple of the block, and a strided (row-sliced) input."""
    _check_split3(shape)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_split3_kernel_equals_reference():
    _check_split3((1000, 5000))


def _check_split3(shape):
    t = _values(*shape, seed=1)
    parts = split3(t)
    for src in (t, _values(shape[0] * 2, shape[1], seed=1)[::2]):
        want = split3(src.contiguous())
        cat = dispatch.split3(src.to(DEV), "cat", backend="triton")
        stack = dispatch.split3(src.to(DEV), "stack", backend="triton")
        assert cat.shape == (shape[0], 3 * shape[1]) and stack.shape == (3, *shape)
        for p, w in enumerate(want[::-1]):  # smallest piece first
            assert torch.equal(_bits(cat[:, p * shape[1]:(p + 1) * shape[1]]), _bits(w)), p
            assert torch.equal(_bits(stack[p]), _bits(w)), p
    normal = (t.abs() >= 2.0 ** -100) | (t == 0)  # the last piece above bf16's subnormals
    assert normal.float().mean() > 0.9
    assert torch.equal(sum(p.double() for p in parts)[normal], t.double()[normal])  # the pieces carry every bit


def test_split3_rejects_what_it_cannot_split():
    with pytest.raises(ValueError, match="layout must be 'cat' or 'stack'"):
        dispatch.split3(torch.ones(2, 3), "rows", backend="reference")


def _check_linear(m: int, k: int, n: int, x_dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(x_dtype)
    w = torch.randn(n, k, generator=g)
    dy = torch.randn(m, n, generator=g)
    xs = x.to(DEV).requires_grad_(True)
    ws = w.to(DEV).requires_grad_(True)
    y = Fp32SplitLinear.apply(xs, ws, {}, False)
    y.backward(dy.to(DEV))
    exact = {"y": x.double() @ w.double().t(), "dx": dy.double() @ w.double(), "dw": dy.double().t() @ x.double()}
    x, w, dy = x.to(DEV), w.to(DEV), dy.to(DEV)
    plain = {"y": mm_split(split3(x), split3(w)), "dx": mm_split(split3(dy), split3(w.t().contiguous())),
             "dw": mm_split(split3(dy.t().contiguous()), split3(x.t().contiguous()))}
    got = {"y": y.detach(), "dx": xs.grad, "dw": ws.grad}
    assert got["dx"].dtype == x_dtype and got["dw"].dtype == torch.float32
    for name, ref in exact.items():
        plain_err = _rel(plain[name], ref)
        assert plain_err <= TOL["rel_gpu" if CUDA else "rel"], (name, "plain", plain_err)
        err, bound = _rel(got[name], ref), max(TOL["rel"], TOL["vs_plain"] * plain_err)
        if name == "dx" and x_dtype == torch.bfloat16:  # rounded once to bf16: plus the rounding of exact
            bound += _rel(ref.to(torch.bfloat16), ref)
        assert err <= bound, (name, err, plain_err)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


@triton_ok
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k, n", [(32, 80), (48, 40)], ids=["grouped", "per-term"])
def test_split_linear_equals_the_fp32_product(k, n, x_dtype):
    """forward, dgrad and wgrad, grouped (N >= K) or one GEMM a term: the fp64 product to fp32 accumulation order,
    as `mm_split` is; a bf16 x (the LM head's) has one piece, an fp32 x three."""
    _check_linear(24, k, n, x_dtype, seed=2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k, n", [(1024, 8192), (2048, 128)], ids=["head", "router"])
def test_gpu_split_linear_at_head_and_router_shapes(k, n, x_dtype):
    _check_linear(512, k, n, x_dtype, seed=3)
