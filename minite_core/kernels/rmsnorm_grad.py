"""The learner's RMSNorm on the fast path: the forward's bits unchanged in 4 launches, the backward in one.

Why: in torch ops an RMSNorm with gradient is ~8 kernels forward (fp32 upcast, x², mean, + eps, rsqrt, scale,
downcast, weight multiply) and ~15 backward, each a pass over fp32 copies of x, four norms a layer (q- and
k-norm over every head). On the H200, at the learner bench's 6 layers and 16,384 tokens, they were ~24 ms of a
minite step's kernels forward and ~30 ms more recomputed and differentiated in backward
(results/h200/bench/NOTES.md, row 24).

Forward, bitwise `model.qwen3_moe.RMSNorm.reference` on the GPU: xf = x.float() [+ residual.float()] and
ms = mean(xf²) stay torch's own ops (the mean's summation order is the reference's bits, and the sampler's: a fused
reduction would add in another order), then `kernels/rmsnorm_tail.py` does the rest in one launch. Saved for
backward: x [and the residual], the weight and ms, one fp32 a row (the `recompute_elementwise` knob's saving,
without its second forward).

Backward, one launch: autograd's derivative formulas through the reference, op by op, in fp32 with each op's
rounding (FMA contraction off). With rstd = rsqrt(ms + eps), n = bf16(xf · rstd), w_b = bf16(w):
  dn = bf16(dy · w_b); part1 = fp32(dn) · rstd; drstd = Σ_d fp32(dn) · xf (rsqrt's output gradient);
  dms = (-0.5 · drstd) · ((rstd · rstd) · rstd) (rsqrt's formula); part2 = (dms / D) · (2 · xf) (mean's, then pow's);
  dx = dtype(part1 + part2) [the residual's gradient: the same sum in its dtype];
  dw = w.dtype(bf16(Σ_rows bf16(dy · n))) (the weight multiply's broadcast, summed in bf16).
So dx and dw differ from autograd's only in the order of the two sums (drstd along a row, dw across rows): within
one rounding of the output dtype (tests/test_rmsnorm_grad.py). dw is summed per program over its rows in fp32,
then the programs' partial rows by torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts, scalar loop bounds)
from minite_core.kernels.rmsnorm_tail import rms_norm_tail

ELEMENTS = 4096  # rows x columns a program holds at once: 2 rows of a 2,048-wide norm, 32 of a 128-wide head norm
PROGRAMS = 1024  # programs of the backward (each loops over its rows): ~8 a streaming multiprocessor on an H200


def supported(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether the fused norm takes these dtypes (bf16 activations, the usual learner); else the caller's reference."""
    return x.dtype == torch.bfloat16 and weight.dtype in (torch.float32, torch.bfloat16) and (
        residual is None or residual.dtype == torch.bfloat16)


@triton.jit
def _rmsnorm_backward_kernel(x_ptr, r_ptr, ms_ptr, w_ptr, dy_ptr, dx_ptr, dr_ptr, dwp_ptr, M, D, eps,
                             HAS_RES: tl.constexpr, GPU: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # x, residual, dy, dx, dr: (M, D) contiguous bf16; ms (M,) fp32; w (D,) bf16; dwp (programs, D) fp32 partial dw
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cok = cols < D
    w = tl.load(w_ptr + cols, mask=cok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(pid * BLOCK_R, M, tl.num_programs(0) * BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        rok = rows < M
        ok = rok[:, None] & cok[None, :]
        off = rows.to(tl.int64)[:, None] * D + cols[None, :]
        xf = tl.load(x_ptr + off, mask=ok, other=0.0).to(tl.float32)
        if HAS_RES:
            xf = xf + tl.load(r_ptr + off, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(ms_ptr + rows, mask=rok, other=1.0) + eps
        if GPU:
            rstd = libdevice.rsqrt(v)  # torch's rsqrt kernel calls the same rsqrtf
        else:  # the interpreter has no libdevice
            rstd = 1.0 / tl.sqrt(v)
        n = (xf * rstd[:, None]).to(tl.bfloat16).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=ok, other=0.0).to(tl.float32)
        dw += tl.sum((dy * n).to(tl.bfloat16).to(tl.float32), axis=0)
        dn = (dy * w[None, :]).to(tl.bfloat16).to(tl.float32)
        drstd = tl.sum(dn * xf, axis=1)
        dms = (-0.5 * drstd) * ((rstd * rstd) * rstd)
        dxf = dn * rstd[:, None] + (dms / D)[:, None] * (2.0 * xf)
        tl.store(dx_ptr + off, dxf.to(tl.bfloat16), mask=ok)
        if HAS_RES:
            tl.store(dr_ptr + off, dxf.to(tl.bfloat16), mask=ok)
    tl.store(dwp_ptr + pid * D + cols, dw, mask=cok)


def rms_norm_backward(x, residual, ms, weight, dy, eps: float):
    """(M, D) x [residual], ms (M,) fp32, weight (D,), dy (M, D) -> dx, dresidual (None without), dweight in
    weight's dtype."""
    M, D = x.shape
    block_d = triton.next_power_of_2(D)
    block_r = max(1, ELEMENTS // block_d)
    programs = max(1, min(PROGRAMS, triton.cdiv(M, block_r)))
    dx = torch.empty_like(x)
    dr = torch.empty_like(residual) if residual is not None else None
    partial = torch.empty(programs, D, dtype=torch.float32, device=x.device)  # each program's rows' dw
    if M:
        _rmsnorm_backward_kernel[(programs,)](
            x, residual if residual is not None else x, ms, weight.detach().to(torch.bfloat16).contiguous(), dy,
            dx, dr if dr is not None else dx, partial, M, D, float(eps), HAS_RES=residual is not None,
            GPU=not interpret.INTERPRET, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4, enable_fp_fusion=False)
    else:
        partial.zero_()
    return dx, dr, partial.sum(0).to(torch.bfloat16).to(weight.dtype)


class FusedRMSNorm(torch.autograd.Function):
    """x (..., D) [+ residual] -> RMSNorm in x's dtype: forward the reference's bits, backward one launch."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        D = x.shape[-1]
        x2 = x.reshape(-1, D).contiguous()
        r2 = residual.reshape(-1, D).contiguous() if residual is not None else None
        xf = x2.float() if r2 is None else x2.float() + r2.float()
        ms = xf.pow(2).mean(-1, keepdim=True)  # torch's reduction: the reference's (and the sampler's) bits
        y = rms_norm_tail(xf, ms, weight.detach().to(x.dtype), eps, x.dtype)
        ctx.save_for_backward(x2, weight, ms, *(() if r2 is None else (r2,)))
        ctx.eps, ctx.shape = eps, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, ms, *res = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape).contiguous()
        dx, dr, dw = rms_norm_backward(x2, res[0] if res else None, ms, weight, dy2, ctx.eps)
        return (dx.view(ctx.shape), dw if ctx.needs_input_grad[1] else None,
                dr.view(ctx.shape) if dr is not None else None, None)
