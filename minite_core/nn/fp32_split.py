"""fp32 GEMMs on bf16 tensor cores: the fp32 LM head / router of the `minite` profile on the GPU fast path.

Why: Hopper runs a true fp32 GEMM on its SIMT cores (~60 TFLOP/s, no TF32 — TF32 would round the operands),
a bf16 GEMM on its tensor cores at ~13x that. The fp32 LM head of a 32k vocabulary took 126 ms of a 623 ms
learner step on the H200 (torch.profiler, `minite bench learner --op-profile`).

How, exactly: an fp32 value splits into three bf16 pieces t1 + t2 + t3 carrying all its bits
(`formats.bf16x3.split3`). A bf16 x bf16 product is exact in fp32, so
    x @ Wᵀ = Σ_{i,j} x_i @ W_jᵀ,
each term a bf16 tensor-core GEMM with fp32 accumulation. The terms with i + j > 4 are below 2^-24 relative —
fp32 rounding level — and are dropped; so are pieces an operand does not have (a bf16 activation is its own first
piece). The result equals the fp32 GEMM up to fp32 accumulation order, which is the contract of every fast GEMM
here (DESIGN.md).

Two ways to issue the terms; the weight is split once per version, in one launch (kernels/split3.py), into
[W_3 | W_2 | W_1] (N, 3K), smallest piece first (that file says why), and every operand below is a view of it:
- wide outputs (N >= K: the LM head): the terms are grouped into few GEMMs by concatenating along K,
  Σ_{j<=2-i} x_i @ W_jᵀ = [x_i | x_i | …] @ [… | W_2 | W_1]ᵀ, a suffix of the split weight. A bf16 x costs 1 GEMM
  forward, 3 for dgrad, 1 for wgrad. One GEMM a term took 3, 6 and 3, plus an fp32 add per term after the
  first, and at the node rank's head (4,096 tokens x 151,936) such an add moved 7.5 GB (forward) or 3.7 GB
  (wgrad). On the H200 the head's forward + backward take 45.6 ms grouped, 62.0 one GEMM a term
  (results/h200/bench/NOTES.md, row 22).
- narrow outputs (the router, N = 128): one GEMM a term (`mm_split`). There the grouping's copies of x and sums
  of (M, 3K) blocks cost more than the term adds it saves: grouped, the router's forward + backward took 1.09 ms
  against 0.83 (results/h200/bench/NOTES.md, row 22).
"""
from __future__ import annotations

import torch

from minite_core.formats.bf16x3 import split3
from minite_core.kernels import dispatch
from minite_core.kernels.dispatch import DqOperand

_PAIRS = ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))  # i + j <= 2 (0-based): every term above 2^-24


def mm_split(a_parts: list[torch.Tensor], b_parts: list[torch.Tensor], invariant: bool = False) -> torch.Tensor:
    """Σ_{i+j<=2} a_i @ b_jᵀ in fp32 (a_i: (M, K), b_j: (N, K)) -> (M, N) fp32, one GEMM a term: the plain form
    of the grouped GEMMs below (tests/test_fp32_split.py) and the batch-invariant forward. invariant=True (profile
    knob `batch_invariant`, forward only): each term through the fixed-tile Triton GEMM (kernels.dispatch.gemm with
    invariant=True, unit global scales), so a row's bits do not depend on M; the terms are summed in fixed order."""
    out = None
    for i, j in _PAIRS:
        if i < len(a_parts) and j < len(b_parts):
            if invariant:
                one = torch.ones((), dtype=torch.float32, device=a_parts[i].device)
                term = dispatch.gemm(DqOperand(a_parts[i].contiguous(), one),
                                     DqOperand(b_parts[j].contiguous(), one), torch.float32, invariant=True)
            else:
                term = _mm(a_parts[i], b_parts[j].t())
            out = term if out is None else out + term
    return out


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 (M, K) @ (K, N) -> fp32. CUDA: bf16 tensor cores, fp32 out; CPU (tests): the same exact products in
    an fp32 matmul."""
    return torch.mm(a, b, out_dtype=torch.float32) if a.is_cuda else a.float() @ b.float()


def weight_cat(weight: torch.Tensor, cache: dict | None) -> torch.Tensor:
    """The fp32 master weight (N, K) as [W_3 | W_2 | W_1] (N, 3K) bf16, once per weight version."""
    version = (weight._version, weight.data_ptr())
    hit = cache.get("split3-cat") if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    with torch.inference_mode(False):  # a cache must serve autograd too (nn.linear.cache_context)
        w_cat = dispatch.split3(weight.detach(), "cat")
    if cache is not None:
        cache["split3-cat"] = (version, w_cat)
    return w_cat


def weight_parts(weight: torch.Tensor, cache: dict | None) -> list[torch.Tensor]:
    """W_1, W_2, W_3 as contiguous (N, K) bf16 (the batch-invariant GEMM's operands), once per weight version."""
    version = (weight._version, weight.data_ptr())
    hit = cache.get("split3") if cache is not None else None
    if hit is not None and hit[0] == version:
        return hit[1]
    with torch.inference_mode(False):
        parts = _pieces(weight.detach())
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


def _pieces(t: torch.Tensor) -> list[torch.Tensor]:
    """t's bf16 pieces, largest first ([t] for bf16), as views of one split3 launch."""
    return [t] if t.dtype == torch.bfloat16 else list(dispatch.split3(t.float(), "stack").unbind(0))[::-1]


class Fp32SplitLinear(torch.autograd.Function):
    """y = x @ Wᵀ in fp32 from bf16 pieces. x: (M, K) bf16 or fp32; weight: (N, K) fp32 master.
    Grouped (N >= K): every product below is one group Σ_{j<=2-i} a_i b_j of `mm_split`'s terms, as one GEMM."""

    @staticmethod
    def forward(ctx, x, weight, cache, invariant=False):
        n, k = weight.shape
        ctx.x_dtype, ctx.grouped = x.dtype, n >= k and not invariant
        if invariant:  # the sampler's and the on-policy learner's forward; its backward is one GEMM a term
            w = weight_parts(weight, cache)
            ctx.save_for_backward(x, *w)
            return mm_split(split3(x), w, invariant=True)
        w_cat = weight_cat(weight, cache)
        if not ctx.grouped:
            w = _w_pieces(w_cat, k)
            ctx.save_for_backward(x, *w)
            return mm_split(_pieces(x), w)
        ctx.save_for_backward(x, w_cat)
        # x_i against W_{3-i}..W_1, concatenated along K
        return _total(_mm(torch.cat([x_i] * (3 - i), dim=1), w_cat[:, i * k:].t()) for i, x_i in enumerate(_pieces(x)))

    @staticmethod
    def backward(ctx, dy):
        x, *w = ctx.saved_tensors  # [W_3 | W_2 | W_1] when grouped, else W_1, W_2, W_3
        m, n = dy.shape
        k = x.shape[1]
        d = dispatch.split3(dy.float(), "stack")  # (3, M, N): the pieces of dy, d_3 first
        dx = dw = None
        if not ctx.grouped:
            d_pieces = list(d.unbind(0))[::-1]
            if ctx.needs_input_grad[0]:
                dx = mm_split(d_pieces, [p.t() for p in w]).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                dw = mm_split([p.t() for p in d_pieces], [p.t() for p in _pieces(x)])
            return dx, dw, None, None
        w_cat = w[0]
        if ctx.needs_input_grad[0]:  # (M, K): d_i @ [W_{3-i} | … | W_1] is the 3 - i terms side by side
            dx = _total(_mm(d[2 - i], w_cat[:, i * k:]).view(m, 3 - i, k).sum(1) if i < 2
                        else _mm(d[0], w_cat[:, 2 * k:]) for i in range(3)).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:  # (N, K): [d_{3-j}; …; d_1]ᵀ @ [x_j; …; x_j], the tokens concatenated
            dw = _total(_mm(d[j:].reshape((3 - j) * m, n).t(), torch.cat([x_j] * (3 - j)))
                        for j, x_j in enumerate(_pieces(x)))
        return dx, dw, None, None


def _w_pieces(w_cat: torch.Tensor, k: int) -> list[torch.Tensor]:
    """W_1, W_2, W_3 (N, K) as views of [W_3 | W_2 | W_1]."""
    return [w_cat[:, (2 - j) * k:(3 - j) * k] for j in range(3)]


def _total(terms) -> torch.Tensor:
    """Sum of the tensors in `terms`, first to last (no 0 + t launch)."""
    out = None
    for t in terms:
        out = t if out is None else out + t
    return out
