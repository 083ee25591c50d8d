"""Batch-invariant RMSNorm (profile knob `batch_invariant`, `minite-onpolicy`): one program per row.

Why: torch's CUDA reduction (`x.pow(2).mean(-1)`) picks its launch config — threads per row, rows per block,
whether a row is split across blocks — from the whole shape, so a row's sum of squares may be added in a
different order in a 64-row decode step than in a 16384-row learner forward (tests/test_onpolicy.py's
`test_gpu_row_reductions_batch_invariant` measures it). Here a row's reduction is one tl.sum over the whole row
(BLOCK_D = next power of two of D), so its order depends on D only.

Arithmetic, as `model.qwen3_moe.RMSNorm` (the plain reference): x (and the residual, fused add-norm) in fp32,
x · 1/sqrt(mean(x²) + eps) with IEEE sqrt and division, rounded to x's dtype, times the weight in x's dtype (the
bf16 product taken exactly in fp32 and rounded once, as torch's bf16 multiply). Agrees with the reference to one
rounding of the output (the sum of squares is added in another order), not bitwise. Backward: autograd through
the reference, recomputed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts, scalar loop bounds)


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, D, eps, HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr):
    # x, residual, y: (M, D) contiguous; w: (D,) already in y's dtype
    row = tl.program_id(0).to(tl.int64)
    rd = tl.arange(0, BLOCK_D)
    ok = rd < D
    x = tl.load(x_ptr + row * D + rd, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        x = x + tl.load(r_ptr + row * D + rd, mask=ok, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / D
    inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms + eps))
    y = (x * inv).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + rd, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + rd, (w * y).to(y_ptr.dtype.element_ty), mask=ok)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x (..., D) [+ residual] -> (..., D) in x's dtype; weight (D,)."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D).contiguous()
    r2 = residual.reshape(-1, D).contiguous() if residual is not None else x2
    y = torch.empty_like(x2)
    _rmsnorm_kernel[(x2.shape[0],)](x2, r2, weight.detach().to(x.dtype).contiguous(), y, D, float(eps),
                                    HAS_RES=residual is not None, BLOCK_D=triton.next_power_of_2(D), num_warps=4)
    return y.view(x.shape)


class InvariantRMSNorm(torch.autograd.Function):
    """Forward: `rms_norm_triton`; backward: autograd through `reference(x, weight, residual)`, recomputed."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, reference):
        ctx.save_for_backward(x, weight, *(() if residual is None else (residual,)))
        ctx.reference = reference
        return rms_norm_triton(x, weight, eps, residual)

    @staticmethod
    def backward(ctx, dy):
        x, weight, *res = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in (x, weight, *res)]
            y = ctx.reference(leaves[0], leaves[1], leaves[2] if res else None)
            need = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(y, need, dy))
        out = [next(grads) if t.requires_grad else None for t in leaves]
        return out[0], out[1], (out[2] if res else None), None, None
