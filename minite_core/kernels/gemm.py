"""Exact W4A4 GEMM for Hopper (no FP4 tensor cores): bf16 tensor-core GEMM on dequantized operands.

Why it is exact: a dequantized element without its global scale, e2m1(q) * sf, has at most 6 significant bits
and lies in [2^-10, 2688], so it is exactly a bf16. A bf16 x bf16 product is exact in fp32, so a bf16
tensor-core GEMM with fp32 accumulation computes sum_k (q_a sf_a)(q_b sf_b) up to fp32 accumulation order;
the global scales (S_dec per tensor or per row of each operand) are applied once in the epilogue:
    y[m, n] = acc[m, n] * (S_a[m] * S_b[n])            (S_x a scalar in per-tensor mode)
The reference (`gemm_reference`) dequantizes fully in fp32 (x̂ = q*sf*S_dec, one more rounding per element)
and multiplies in fp32, so the two agree to fp32 accumulation-order tolerance, not bitwise.

Operands reach the GEMM as `kernels.operands.DqOperand` (values_bf16 = e2m1(q)*sf, global_scale S_dec).

Two implementations, chosen by measurement on the H200 (results/h200/bench/kernels.json, one run, medians):
- `gemm_cublas`: cuBLAS via torch.mm(out_dtype=fp32), then a scale+cast kernel (an extra M*N*(4+4+2) bytes).
  M=16384 N=K=4096: GEMM 0.832 ms (661 TFLOP/s) vs bf16 F.linear 0.742 ms (741); 8192^3: 1.518 vs 1.453 ms.
- `gemm_triton`: Triton tiled GEMM (tl.dot -> wgmma) with the scale epilogue fused. Default tile 128x256x64,
  3 stages, 8 warps: 0.956 ms at 16384x4096x4096 (575 TFLOP/s), 1.704 ms at 8192^3; sweep best 128x256x64
  with 4 stages 0.876 ms; 128x256x64 with 4 warps spills (6.1 ms). -> dense GEMM: cuBLAS (gemm_ops.gemm).
- `gemm_triton_quant`: `gemm_triton` with the activation's quantizer in its prologue (kernels/quant_prologue.py:
  raw x in, no bf16 x̂ in memory), bit for bit `quantize_triton(emit_dq=True)` + `gemm_triton` at one config —
  not the cuBLAS path's bits (another accumulation order), so nn.linear keeps the separate pass + cuBLAS.
- Grouped (MoE) GEMMs live in `kernels/grouped.py`.
Whole W4A4 linear forward (activation row-dynamic quantize emitting the bf16 copy + GEMM + scales, weights
prepared): 1.074 ms = 1.45x bf16 at 16384x4096x4096 (target <= 1.10x: NOT met); 1.846 ms = 1.27x at 8192^3.
The gap is the quantizer (0.24 ms, 30% of copy bandwidth) plus the fp32 epilogue round trip (~0.09 ms).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.kernels.interpret import INTERPRET
from minite_core.kernels.operands import DqOperand, dq_operand  # noqa: F401  (re-exported for callers)
from minite_core.kernels.quant_prologue import a_scales, a_stream, a_tile, check_a

# Hopper tile for bf16 wgmma; (128, 256, 64) x 3 stages x 8 warps is the usual best for large squares on
# H100/H200 (Triton's matmul tutorial configs); re-checked by the bench's config sweep.
GEMM_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
# Batch-invariant GEMM (`gemm_invariant`, minite-onpolicy): ONE tile for every M — a decode step's 64 rows and
# a learner forward's 16384 run the same program per output tile, each row's K reduction in BLOCK_K steps in
# increasing k, no split-K, and no row of a tile reads another row. Not tuned by M on purpose (a small-M tile
# could change the wgmma shape); the cost at decode M is idle tensor-core rows.
# Under the interpreter `_dot_rows` materialises a (BLOCK_M, BLOCK_K, BLOCK_N) product, so K steps of 16 there
# (Triton's 2^20-element block limit); still one config for every M.
INVARIANT_CONFIG = dict(GEMM_CONFIG, ROW_DOT=True, **({"BLOCK_K": 16} if INTERPRET else {}))


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def _dot(a, b, acc, INTERPRET: tl.constexpr):
    """bf16 tensor-core dot. Triton 3.6's interpreter multiplies bf16 dot operands as raw bits (wrong), so
    under TRITON_INTERPRET the (exact) operands are widened to fp32 and multiplied in IEEE fp32 instead."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _dot_rows(a, b, acc, INTERPRET: tl.constexpr):
    """`_dot` whose output row depends only on its own row, under the interpreter too: there tl.dot is numpy's
    BLAS sgemm, whose result for a row depends on the row's place in the tile (measured: OpenBLAS 0.3.31), so the
    exact fp32 products are summed with tl.sum along K instead. On a GPU this is tl.dot (a wgmma row's K order
    does not depend on the other rows; tests/test_batch_invariant.py's gpu tests check it)."""
    if INTERPRET:
        return acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    return tl.dot(a, b, acc)


@triton.jit
def _epilogue(acc, sa, sb_ptr, rn, N, SB_ROW: tl.constexpr):
    """acc * (S_a * S_b); sa: the A scales, per row (BM, 1) or one."""
    if SB_ROW:
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr)
    return acc * (sa * sb)


@triton.jit
def _gemm_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, sdec_ptr,
    M, N, K, stride_am, stride_bn, stride_cm, seed, sr_row0,
    SA_ROW: tl.constexpr, SB_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERPRET: tl.constexpr = False, ROW_DOT: tl.constexpr = False, QUANT: tl.constexpr = False,
    FAST: tl.constexpr = False, SR: tl.constexpr = False,
):
    # C[M, N] = (A[M, K] @ B[N, K]^T) * S_a * S_b ; grouped launch order for L2 reuse
    # QUANT (`gemm_triton_quant`, kernels/quant_prologue.py): a = the raw x, quantized in the loop; sa = its amax
    # (per row with SA_ROW), S_dec written to sdec; SR draws `seed`'s stream at rows + sr_row0 (a shard's origin)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    gm = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % gm
    pid_n = (pid % group) // gm
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = tl.where(rm < M, rm, 0).to(tl.int64)  # clamp rows: loads stay in bounds, stores are masked
    bn = tl.where(rn < N, rn, 0).to(tl.int64)
    if QUANT:
        s_enc, s_dec = a_scales(sa_ptr, sdec_ptr, am, rm < M, pid_n == 0, pid_m == 0, SA_ROW, BLOCK_M)
        if SR:
            seed_r, ctr_row = a_stream(sa_ptr, sa_ptr, am + sr_row0, seed, False)
        else:
            seed_r, ctr_row = 0, 0
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + bn[None, :] * stride_bn + rk[:, None]  # (BK, BN) view of B^T
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + rk) < K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
        if QUANT:
            a = a_tile(a, s_enc, s_dec, seed_r, ctr_row, k0, FAST, SR, BLOCK_M, BLOCK_K)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        acc = _dot_rows(a, b, acc, INTERPRET) if ROW_DOT else _dot(a, b, acc, INTERPRET)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if QUANT:
        sa = s_dec[:, None]
    elif SA_ROW:
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None]
    else:
        sa = tl.load(sa_ptr)
    out = _epilogue(acc, sa, sb_ptr, rn, N, SB_ROW)
    cmask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :], out.to(c_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _scale_cast_kernel(acc_ptr, c_ptr, sa_ptr, sb_ptr, M, N, SA_ROW: tl.constexpr, SB_ROW: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Epilogue for the cuBLAS path: c = acc_fp32 * S_a * S_b cast to c's dtype."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    idx = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.load(acc_ptr + idx, mask=mask, other=0.0)
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None] if SA_ROW else tl.load(sa_ptr)
    sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :] if SB_ROW else tl.load(sb_ptr)
    tl.store(c_ptr + idx, (acc * (sa * sb)).to(c_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------- launchers
def _scales(a: DqOperand, b: DqOperand, m: int, n: int):
    sa, sb = a.global_scale.float().contiguous(), b.global_scale.float().contiguous()
    sa_row, sb_row = sa.numel() > 1 or sa.ndim == 2, sb.numel() > 1 or sb.ndim == 2
    return sa, sb, sa_row, sb_row


def gemm_triton(a: DqOperand, b: DqOperand, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = (a_hat @ b_hat^T) with a [M, K], b [N, K] (dequantized bf16 + S_dec)."""
    sa, _, sa_row, _ = _scales(a, b, 0, 0)
    return _gemm_launch(a.values_bf16, sa, sa_row, b, out_dtype, config)[0]


def gemm_triton_quant(x: torch.Tensor, amax: torch.Tensor, b: DqOperand, out_dtype=torch.bfloat16, *,
                      math: str = "exact", rounding: str = "rne", seed: int | None = None, sr_row0: int = 0,
                      config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [M, N], S_x): `gemm_triton` with x [M, K] (bf16 / fp32, unit stride along K) quantized to 1×16 NVFP4 in
    the GEMM's prologue (kernels/quant_prologue.py). amax: [] (one for the tensor: static, or the dynamic max) or
    [M] (per-token); S_x = S_dec of x̂, [] or [M, 1]. rounding="sr" draws `seed`'s stream at rows + sr_row0 (a
    token shard's sr_origin row). Bit for bit `quantize_triton(x, scale_mode=..., amax=amax, seed=seed,
    sr_origin=(sr_row0, 0), emit_dq=True)` then `gemm_triton` on its DqOperand, with the same config."""
    amax, per_row = check_a(x, amax, rounding, math, seed is not None, x.shape[0])
    return _gemm_launch(x, amax, per_row, b, out_dtype, config, (math, rounding, seed or 0, sr_row0))


def _gemm_launch(x, sa, sa_row: bool, b: DqOperand, out_dtype, config, quant=None):
    """One `_gemm_kernel` launch; quant = (math, rounding, seed, sr_row0): x raw and sa its amax (QUANT)."""
    cfg = dict(GEMM_CONFIG, **(config or {}))
    w = b.values_bf16
    m, k = x.shape
    n = w.shape[0]
    sb = b.global_scale.float().contiguous()
    c = torch.empty(m, n, dtype=out_dtype, device=x.device)
    s_x = None if quant is None else torch.empty((m, 1) if sa_row else (), dtype=torch.float32, device=x.device)
    if m == 0:
        return c, s_x
    math, rounding, seed, row0 = quant or ("exact", "rne", 0, 0)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _gemm_kernel[grid](x, w, c, sa, sb, sa if s_x is None else s_x, m, n, k, x.stride(0), w.stride(0), c.stride(0),
                       seed, row0, SA_ROW=sa_row, SB_ROW=sb.numel() > 1 or sb.ndim == 2, INTERPRET=INTERPRET,
                       QUANT=quant is not None, FAST=math == "fast", SR=rounding == "sr", **cfg)
    return c, s_x


def gemm_invariant(a: DqOperand, b: DqOperand, out_dtype=torch.bfloat16) -> torch.Tensor:
    """`gemm_triton` with INVARIANT_CONFIG whatever the shape (profile knob `batch_invariant`)."""
    return gemm_triton(a, b, out_dtype, config=INVARIANT_CONFIG)


def _scale_cast(acc, sa, sb, sa_row, sb_row, out_dtype):
    m, n = acc.shape
    c = torch.empty(m, n, dtype=out_dtype, device=acc.device)
    grid = (triton.cdiv(m, 32), triton.cdiv(n, 128))
    _scale_cast_kernel[grid](acc, c, sa, sb, m, n, SA_ROW=sa_row, SB_ROW=sb_row, BLOCK_M=32, BLOCK_N=128,
                             num_warps=4)
    return c


def gemm_cublas(a: DqOperand, b: DqOperand, out_dtype=torch.bfloat16) -> torch.Tensor:
    """cuBLAS bf16 GEMM with fp32 output (torch.mm out_dtype), then the scale epilogue as a second kernel."""
    x, w = a.values_bf16, b.values_bf16
    sa, sb, sa_row, sb_row = _scales(a, b, x.shape[0], w.shape[0])
    acc = torch.mm(x, w.t(), out_dtype=torch.float32)
    return _scale_cast(acc, sa, sb, sa_row, sb_row, out_dtype)
