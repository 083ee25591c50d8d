"""The MoE layer's row movement in Triton: `permute` (token rows -> the padded expert layout) and `combine` (a
token's k expert rows weighted and summed), with their backwards. `nn.moe_layout` holds the plain references.

Shape legend: N = tokens, k = experts per token, D = hidden, Tp = padded routed rows; dest (N, k) is the padded row
of each (token, rank), src (Tp,) the token of each padded row (N for pad rows).

Why: in torch ops these are gathers, casts, broadcast multiplies and reductions, each a pass over the (N, k, D)
routed rows. At one 8-GPU node rank's shape (4,096 tokens, H200; results/h200/bench/NOTES.md, row 23) combine's
forward alone was three kernels and 0.44 ms a layer, its fp32 (N, k, D) product written once and read back; the
backwards added a gather, an index_put over a zeroed buffer, a cast and two reductions. Here each direction of each op is one
launch that reads its rows once and writes its result once: permute 2 launches -> 1, its backward 3 -> 1, combine
3 -> 1, its backward ~6 -> 1.

Arithmetic, the references' (`nn.moe_layout.permute_reference` / `combine_reference` and autograd through them).
P = the promoted dtype of (y_pad, top_w): the router dtype decides (fp32 router: fp32; bf16 router: bf16).
- permute: a copy (pad rows zero); backward dx[t] = Σ_j fp32(g[dest[t, j]]) in rank order, rounded to g's dtype.
- combine: out[t] = Σ_j fp32(P(y[dest[t, j]] · w[t, j])) in rank order, fp32. torch sums a (N, k, D) tensor over
  k in rank order on the CPU, so the forward is bitwise the CPU reference. torch's CUDA reduction adds in another
  order (on the H200, 4.8 M of 8.4 M sums at one node rank's shape differed), so on a GPU the torch spelling and this
  one differ in fp32 summation order.
- combine's backward, as autograd runs it: gP = P(g) (the `.float()` cast's backward); dy[dest[t, j]] =
  y_dtype(P(gP · w[t, j])), pad rows 0, bitwise; dw[t, j] = W(P(Σ_d P(gP[d] · y[d]))), the sum in fp32 in this
  kernel's order (blocks of D, then sequential), so within fp32 (or P's) rounding of torch's reduction order.
Products are taken in fp32 and rounded to P, as torch's bf16 ops do (a bf16 x bf16 product is exact in fp32);
FMA contraction is off (`enable_fp_fusion=False`), as the reference multiplies and adds in separate kernels.
Every program owns whole output rows, so the results do not depend on N: batch-invariant by construction.

Backward of combine: one program per padded row r, not per token. Row r is (t, j) = (src[r], the rank whose dest is
r), so the program writes dy[r] (zeros for a pad row: no memset of the buffer first) and dw[t, j]; no two programs
write the same element, so no atomics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels import interpret  # noqa: F401  (its interpreter fixes: bf16 RNE casts, scalar loop bounds)

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}
BLOCK_D = 1024  # columns a program handles at once: a 2,048-wide row in two steps, 8 elements a thread


def supported(y: torch.Tensor, w: torch.Tensor | None = None) -> bool:
    """Whether the kernels take these dtypes (fp32 and bf16 rows and weights); else the caller runs the reference."""
    return y.dtype in _TL and (w is None or w.dtype in _TL)


@triton.jit
def _gather_kernel(x_ptr, src_ptr, out_ptr, N, D, BLOCK_D: tl.constexpr):
    # out[r] = x[src[r]], zeros where src[r] == N (pad rows)
    r = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = d < D
    t = tl.load(src_ptr + r)
    row = tl.load(x_ptr + t * D + d, mask=ok & (t < N), other=0.0)
    tl.store(out_ptr + r * D + d, row, mask=ok)


@triton.jit
def _rank_sum_kernel(y_ptr, dest_ptr, w_ptr, out_ptr, D, K: tl.constexpr, HAS_W: tl.constexpr, P: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    # out[t] = Σ_j (P(y[dest[t, j]] · w[t, j]) if HAS_W else y[dest[t, j]]), summed in fp32 in rank order j = 0..k-1
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = d < D
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for j in tl.static_range(K):
        r = tl.load(dest_ptr + t * K + j)
        y = tl.load(y_ptr + r * D + d, mask=ok, other=0.0).to(tl.float32)
        if HAS_W:
            y = (y * tl.load(w_ptr + t * K + j).to(tl.float32)).to(P).to(tl.float32)
        acc += y
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _combine_backward_kernel(g_ptr, y_ptr, w_ptr, dest_ptr, src_ptr, dy_ptr, dw_ptr, N, D, K: tl.constexpr,
                             KP: tl.constexpr, P: tl.constexpr, BLOCK_D: tl.constexpr):
    # padded row r = (token t, rank j): dy[r] = y_dtype(P(P(g[t]) · w[t, j])), dw[t, j] = Σ_d P(P(g[t, d]) · y[r, d]);
    # a pad row (t == N) stores zeros and no dw
    r = tl.program_id(0).to(tl.int64)
    t = tl.load(src_ptr + r)
    real = t < N
    t = tl.where(real, t, 0)
    js = tl.arange(0, KP)
    ranks = js < K
    hit = (tl.load(dest_ptr + t * K + js, mask=ranks & real, other=-1) == r) & ranks  # exactly one j of a real row
    w = tl.sum(tl.where(hit, tl.load(w_ptr + t * K + js, mask=ranks & real, other=0.0).to(tl.float32), 0.0))
    j = tl.sum(tl.where(hit, js, 0))
    dw = tl.zeros((BLOCK_D,), tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        ok = d < D
        g = tl.load(g_ptr + t * D + d, mask=ok & real, other=0.0).to(P).to(tl.float32)
        y = tl.load(y_ptr + r * D + d, mask=ok, other=0.0).to(tl.float32)
        tl.store(dy_ptr + r * D + d, (g * w).to(P).to(dy_ptr.dtype.element_ty), mask=ok)
        dw += (g * y).to(P).to(tl.float32)
    tl.store(dw_ptr + t * K + j, tl.sum(dw).to(P).to(dw_ptr.dtype.element_ty), mask=real)


def gather_rows(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """x (N, D) -> (Tp, D): x[src[r]], zeros where src[r] == N."""
    x = x.contiguous()
    (N, D), Tp = x.shape, src.shape[0]
    out = torch.empty(Tp, D, dtype=x.dtype, device=x.device)
    if out.numel():
        _gather_kernel[(Tp, triton.cdiv(D, BLOCK_D))](x, src, out, N, D, BLOCK_D=BLOCK_D, num_warps=4)
    return out


def rank_sum(y: torch.Tensor, dest: torch.Tensor, w: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """y (Tp, D), dest (N, k)[, w (N, k)] -> (N, D) out_dtype: Σ_j [P(y[dest[t, j]] · w[t, j]) | y[dest[t, j]]],
    in fp32 in rank order."""
    y, dest = y.contiguous(), dest.contiguous()
    (N, K), D = dest.shape, y.shape[1]
    out = torch.empty(N, D, dtype=out_dtype, device=y.device)
    p = torch.promote_types(y.dtype, w.dtype) if w is not None else torch.float32
    if out.numel():
        _rank_sum_kernel[(N, triton.cdiv(D, BLOCK_D))](
            y, dest, w.contiguous() if w is not None else y, out, D, K=K, HAS_W=w is not None, P=_TL[p],
            BLOCK_D=BLOCK_D, num_warps=4, enable_fp_fusion=False)
    return out


def combine_backward(g: torch.Tensor, y: torch.Tensor, w: torch.Tensor, dest: torch.Tensor, src: torch.Tensor):
    """g (N, D) fp32, y (Tp, D), w (N, k), dest (N, k), src (Tp,) -> dy (Tp, D) in y's dtype, dw (N, k) in w's."""
    g, y, w = g.contiguous(), y.contiguous(), w.contiguous()
    (N, K), (Tp, D) = dest.shape, y.shape
    dy = torch.empty_like(y)
    dw = torch.empty_like(w)
    if dy.numel():
        _combine_backward_kernel[(Tp,)](g, y, w, dest.contiguous(), src, dy, dw, N, D, K=K,
                                        KP=triton.next_power_of_2(K), P=_TL[torch.promote_types(y.dtype, w.dtype)],
                                        BLOCK_D=BLOCK_D, num_warps=4, enable_fp_fusion=False)
    return dy, dw


class Permute(torch.autograd.Function):
    """x (N, D) -> (Tp, D) in the padded layout; backward: a token's k row gradients summed in rank order."""

    @staticmethod
    def forward(ctx, x, src, dest):
        ctx.save_for_backward(dest)
        return gather_rows(x, src)

    @staticmethod
    def backward(ctx, g):
        (dest,) = ctx.saved_tensors
        return rank_sum(g, dest, None, g.dtype), None, None


class Combine(torch.autograd.Function):
    """y_pad (Tp, D), top_w (N, k) -> (N, D) fp32: a token's k rows weighted and summed in rank order."""

    @staticmethod
    def forward(ctx, y, w, dest, src):
        ctx.save_for_backward(y, w, dest, src)
        return rank_sum(y, dest, w, torch.float32)

    @staticmethod
    def backward(ctx, g):
        y, w, dest, src = ctx.saved_tensors
        dy, dw = combine_backward(g, y, w, dest, src)
        return dy, dw, None, None
