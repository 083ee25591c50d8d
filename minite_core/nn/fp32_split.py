"""fp32 GEMMs on bf16 tensor cores: the fp32 LM head / router of the `minite` profile on the GPU fast path.

Why: Hopper runs a true fp32 GEMM on its SIMT cores (~60 TFLOP/s, no TF32 — TF32 would round the operands),
a bf16 GEMM on its tensor cores at ~13x that. The fp32 LM head of a 32k vocabulary took 126 ms of a 623 ms
learner step on the H200 (torch.profiler, `minite bench learner --op-profile`).

How, exactly: an fp32 value splits into three bf16 pieces, t = t1 + t2 + t3 with t1 = bf16(t), t2 = bf16(t - t1),
t3 = bf16(t - t1 - t2); every difference is exact in fp32 and the three pieces carry all 24 significant bits
(bf16 has fp32's exponent range; subnormal tails below 2^-126 aside). A bf16 x bf16 product is exact in fp32, so
    x @ Wᵀ = Σ_{i,j} x_i @ W_jᵀ,
each term a bf16 tensor-core GEMM with fp32 accumulation. The terms with i + j > 4 are below 2^-24 relative —
fp32 rounding level — and are dropped; so are pieces an operand does not have (a bf16 activation is its own first
piece). The result equals the fp32 GEMM up to fp32 accumulation order, which is the contract of every fast GEMM
here (DESIGN.md), at 3 GEMMs for the forward (x is bf16 in the model), 6 for dgrad and 3 for wgrad.
"""
from __future__ import annotations

import torch

from minite_core.kernels import dispatch
from minite_core.kernels.operands import DqOperand

_PAIRS = ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))  # i + j <= 2 (0-based): every term above 2^-24


def split3(t: torch.Tensor) -> list[torch.Tensor]:
    """t (fp32) -> [t1, t2, t3] bf16 with t1 + t2 + t3 == t (exactly, for normal values). A bf16 input is [t]."""
    if t.dtype == torch.bfloat16:
        return [t]
    t = t.float()
    t1 = t.to(torch.bfloat16)
    r = t - t1.float()
    t2 = r.to(torch.bfloat16)
    return [t1, t2, (r - t2.float()).to(torch.bfloat16)]


def mm_split(a_parts: list[torch.Tensor], b_parts: list[torch.Tensor], invariant: bool = False) -> torch.Tensor:
    """Σ_{i+j<=2} a_i @ b_jᵀ in fp32 (a_i: (M, K), b_j: (N, K)) -> (M, N) fp32. invariant=True (profile knob
    `batch_invariant`, forward only): each term through the fixed-tile Triton GEMM (kernels.dispatch.gemm with
    invariant=True, unit global scales), so a row's bits do not depend on M; the terms are summed in fixed order."""
    out = None
    for i, j in _PAIRS:
        if i < len(a_parts) and j < len(b_parts):
            a, b = a_parts[i], b_parts[j].t()
            if invariant:
                one = torch.ones((), dtype=torch.float32, device=a.device)
                term = dispatch.gemm(DqOperand(a.contiguous(), one), DqOperand(b_parts[j].contiguous(), one),
                                     torch.float32, invariant=True)
            # CUDA: bf16 tensor cores, fp32 out; CPU (tests): the same exact products in an fp32 matmul
            elif a.is_cuda:
                term = torch.mm(a, b, out_dtype=torch.float32)
            else:
                term = a.float() @ b.float()
            out = term if out is None else out + term
    return out


def weight_parts(weight: torch.Tensor, cache: dict | None) -> list[torch.Tensor]:
    """split3 of the fp32 master weight, once per weight version."""
    version = (weight._version, weight.data_ptr())
    hit = cache.get("split3") if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    with torch.inference_mode(False):  # a cache must serve autograd too (nn.linear.cache_context)
        parts = split3(weight.detach())
    if cache is not None:
        cache["split3"] = (version, parts)
    return parts


def fp32_split_linear(x: torch.Tensor, weight: torch.Tensor, cache: dict | None,
                      invariant: bool = False) -> torch.Tensor:
    """y = x @ Wᵀ in fp32 for x (..., K) bf16 or fp32 and the fp32 master weight (N, K) -> (..., N) fp32.
    invariant: the forward's GEMMs batch-invariant (`mm_split`); the backward is not."""
    lead = x.shape[:-1]
    y = Fp32SplitLinear.apply(x.reshape(-1, x.shape[-1]), weight, cache, invariant)
    return y.reshape(*lead, weight.shape[0])


class Fp32SplitLinear(torch.autograd.Function):
    """y = x @ Wᵀ in fp32 from bf16 pieces. x: (M, K) bf16 or fp32; weight: (N, K) fp32 master."""

    @staticmethod
    def forward(ctx, x, weight, cache, invariant=False):
        w_parts = weight_parts(weight, cache)
        x_parts = split3(x)
        ctx.save_for_backward(x, *w_parts)
        ctx.x_dtype, ctx.n_parts = x.dtype, len(x_parts)
        return mm_split(x_parts, w_parts, invariant)

    @staticmethod
    def backward(ctx, dy):
        x, *w_parts = ctx.saved_tensors
        dy_parts = split3(dy.float())
        dx = dw = None
        if ctx.needs_input_grad[0]:  # (M, K) = dy (M, N) @ W (N, K): the pieces of Wᵀ are the transposed pieces
            dx = mm_split(dy_parts, [w.t() for w in w_parts]).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:  # (N, K) = dyᵀ (N, M) @ x (M, K)
            dw = mm_split([d.t() for d in dy_parts], [p.t() for p in split3(x)])
        return dx, dw, None, None
