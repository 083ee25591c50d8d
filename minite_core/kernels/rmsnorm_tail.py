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
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts)

BLOCK = 1024


@triton.jit
def _tail_kernel(x_ptr, ms_ptr, w_ptr, y_ptr, n, D, eps, GPU: tl.constexpr, BLOCK: tl.constexpr):
    # x (rows, D) fp32 contiguous, ms (rows,) fp32, w (D,) in y's dtype, y (rows, D)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    x = tl.load(x_ptr + i, mask=ok, other=0.0)
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
    _tail_kernel[(triton.cdiv(n, BLOCK),)](x2, ms.contiguous(), weight.contiguous(), y, n, D, float(eps),
                                           GPU=not interpret.INTERPRET, BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False)
    return y
