"""RMSNorm after its reduction in one launch: `model.qwen3_moe.RMSNorm.reference` bitwise, forward only.

Why: the reference RMSNorm is ~8 kernels (upcast, square, mean, + eps, rsqrt, scale, downcast, weight multiply),
called 4 times a layer; in a CUDA-graph decode step of the small RL model that was 136 of ~350 launches at ~1.5 us
each. The mean stays torch's own reduction (its summation order is the reference's bits; a fused reduction would
add in another order — the batch-invariant kernel, kernels/rmsnorm.py, does and is not bitwise). This kernel does
the rest: y = bf16(w · bf16(x · rsqrt(ms + eps))), elementwise.

Arithmetic, as the reference's torch ops: ms + eps in fp32 (eps as fp32, torch's scalar add), rsqrt = CUDA's
rsqrtf (libdevice `rsqrt`, what torch's rsqrt kernel calls), x · r in fp32, rounded (RNE) to the output dtype,
times the weight (already in the output dtype) with the product taken in fp32 and rounded once — torch's
bf16/fp16 multiply. Each multiply is its own rounding (no FMA: there is no add to contract into). On CPU (the
interpreter) rsqrt is numpy's 1/sqrt, not torch's: that path is tested within one rounding, the GPU bitwise.

`rms_norm_nograd` (decode, eval) goes one launch further: it reads x (and the residual) in their own dtype, so the
fp32 upcast is never written. A first launch writes the fp32 squares (x + residual)² — an exact upcast, one fp32
add, one multiply, as the reference's `x.float() + residual.float()` and `pow(2)` (torch computes x² as x · x) —
torch's mean reduces them (the same contiguous fp32 tensor the reference's `pow(2)` makes, so the same reduction
and bits), and the tail upcasts x again instead of reading the fp32 copy. Three launches a norm instead of four (five
with a residual), 14 bytes an element moved instead of 24 (bf16 x). x may be a column slice (`row_groups`: q and k of
a packed q|k|v output), read in place where the reference's upcast would copy it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts)

BLOCK = 1024


@triton.jit
def _upcast(x_ptr, r_ptr, i, ok, D, R2, S1, HAS_RES: tl.constexpr):
    """The reference's x_fp32 at flat index i of (rows, D): x.float() (+ residual.float()). x's row `row` starts at
    (row // R2) · S1 + (row % R2) · D (groups of R2 packed rows S1 apart: a column slice; R2 = rows for a
    contiguous x); the residual is contiguous."""
    row = i // D
    x = tl.load(x_ptr + (row // R2) * S1 + (row % R2) * D + i % D, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        x = x + tl.load(r_ptr + i, mask=ok, other=0.0).to(tl.float32)
    return x


@triton.jit
def _square_kernel(x_ptr, r_ptr, sq_ptr, n, D, R2, S1, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    # x, r (rows, D) in any float dtype (x as `_upcast` reads it), sq (rows, D) fp32 contiguous = x_fp32 · x_fp32
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    x = _upcast(x_ptr, r_ptr, i, ok, D, R2, S1, HAS_RES)
    tl.store(sq_ptr + i, x * x, mask=ok)


@triton.jit
def _tail_kernel(x_ptr, r_ptr, ms_ptr, w_ptr, y_ptr, n, D, R2, S1, eps, HAS_RES: tl.constexpr, GPU: tl.constexpr,
                 BLOCK: tl.constexpr):
    # x, r (rows, D) (x fp32, or any float dtype upcast here; as `_upcast` reads them), ms (rows,) fp32, w (D,) in
    # y's dtype, y (rows, D) contiguous
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    x = _upcast(x_ptr, r_ptr, i, ok, D, R2, S1, HAS_RES)
    v = tl.load(ms_ptr + i // D, mask=ok, other=1.0) + eps
    if GPU:
        r = libdevice.rsqrt(v)
    else:  # the interpreter has no libdevice
        r = 1.0 / tl.sqrt(v)
    y = (x * r).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + i % D, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, (w * y).to(y_ptr.dtype.element_ty), mask=ok)


def rms_norm_tail(x_fp32: torch.Tensor, ms: torch.Tensor, weight: torch.Tensor, eps: float,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """x_fp32 (..., D) fp32, ms (..., 1) fp32 = mean(x²), weight (D,) in out_dtype -> (..., D) in out_dtype."""
    D = x_fp32.shape[-1]
    x2 = x_fp32.contiguous()
    y = torch.empty(x2.shape, dtype=out_dtype, device=x2.device)
    n = x2.numel()
    _tail_kernel[(triton.cdiv(n, BLOCK),)](x2, x2, ms.contiguous(), weight.contiguous(), y, n, D, *row_groups(x2),
                                           float(eps), HAS_RES=False, GPU=not interpret.INTERPRET, BLOCK=BLOCK,
                                           num_warps=4, enable_fp_fusion=False)
    return y


def row_groups(x: torch.Tensor) -> tuple[int, int] | None:
    """(R2, S1) of x (..., D) as `_upcast` reads it, or None: contiguous x, or x viewed as (R1, R2, D) with strides
    (S1, D, 1), S1 > R2 · D — a column slice such as q of a q|k|v GEMM's output, whose fp32 copy (`x.float()`, not
    dense) torch makes contiguous, so the reference reduces a contiguous tensor too."""
    D = x.shape[-1]
    if x.is_contiguous():
        return max(x.numel() // max(D, 1), 1), 0
    for R2 in (x.shape[-2] if x.dim() >= 2 else 1, 1):  # heads packed in a row, else one row a group
        try:
            x3 = x.view(-1, R2, D)
        except RuntimeError:  # the leading dims do not flatten into one stride
            continue
        if x3.stride(2) == 1 and (R2 == 1 or x3.stride(1) == D) and x3.stride(0) > R2 * D:
            return R2, x3.stride(0)
    return None


def rms_norm_nograd(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                    groups: tuple[int, int] | None = None) -> torch.Tensor:
    """The whole RMSNorm of x (..., D) [+ residual] from its inputs (module docstring), `RMSNorm.reference`'s bits.
    x as `row_groups` takes it (`groups`: its answer, if the caller has it; contiguous with a residual), residual
    contiguous of x's shape; weight (D,) in x's dtype -> (..., D) contiguous in x's dtype."""
    n, D = x.numel(), x.shape[-1]
    R2, S1 = groups or row_groups(x)
    r = x if residual is None else residual
    ms = squares(x, residual, (R2, S1)).mean(-1, keepdim=True)  # torch's reduction: the reference's order
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _tail_kernel[(triton.cdiv(n, BLOCK),)](x, r, ms, weight.contiguous(), y, n, D, R2, S1, float(eps),
                                           HAS_RES=residual is not None, GPU=not interpret.INTERPRET, BLOCK=BLOCK,
                                           num_warps=4, enable_fp_fusion=False)
    return y


def squares(x: torch.Tensor, residual: torch.Tensor | None = None,
            groups: tuple[int, int] | None = None) -> torch.Tensor:
    """(x.float() + residual.float())², fp32, contiguous; x as `row_groups` takes it (`groups`), residual
    contiguous."""
    n, D = x.numel(), x.shape[-1]
    R2, S1 = groups or row_groups(x)
    sq = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _square_kernel[(triton.cdiv(n, BLOCK),)](x, x if residual is None else residual, sq, n, D, R2, S1,
                                             HAS_RES=residual is not None, BLOCK=BLOCK, num_warps=4,
                                             enable_fp_fusion=False)
    return sq
