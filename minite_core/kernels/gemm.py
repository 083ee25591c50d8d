"""Exact W4A4 GEMM for Hopper (no FP4 tensor cores): bf16 tensor-core GEMM on dequantized operands.

Why it is exact: a dequantized element without its global scale, e2m1(q) * sf, has at most 6 significant bits
and lies in [2^-10, 2688], so it is exactly a bf16. A bf16 x bf16 product is exact in fp32, so a bf16
tensor-core GEMM with fp32 accumulation computes sum_k (q_a sf_a)(q_b sf_b) up to fp32 accumulation order;
the global scales (S_dec per tensor or per row of each operand) are applied once in the epilogue:
    y[m, n] = acc[m, n] * (S_a[m] * S_b[n])            (S_x a scalar in per-tensor mode)
The reference (`gemm_reference`) dequantizes fully in fp32 (x̂ = q*sf*S_dec, one more rounding per element)
and multiplies in fp32, so the two agree to fp32 accumulation-order tolerance, not bitwise.

Operands reach the GEMM as `DqOperand` = (values_bf16 = e2m1(q)*sf [R, K], global_scale S_dec): activations
get it for free from the fused quantizer (`quantize_triton(..., emit_dq=True)`), weights are dequantized once
per optimizer step and cached (`dq_operand`).

Two implementations, chosen by measurement on the H200 (results/h200/bench/kernels.json, one run, medians):
- `gemm_cublas`: cuBLAS via torch.mm(out_dtype=fp32), then a scale+cast kernel (an extra M*N*(4+4+2) bytes).
  M=16384 N=K=4096: GEMM 0.832 ms (661 TFLOP/s) vs bf16 F.linear 0.742 ms (741); 8192^3: 1.518 vs 1.453 ms.
- `gemm_triton`: Triton tiled GEMM (tl.dot -> wgmma) with the scale epilogue fused. Default tile 128x256x64,
  3 stages, 8 warps: 0.956 ms at 16384x4096x4096 (575 TFLOP/s), 1.704 ms at 8192^3; sweep best 128x256x64
  with 4 stages 0.876 ms; 128x256x64 with 4 warps spills (6.1 ms). -> dense GEMM: cuBLAS (dispatch.HOPPER_GEMM).
- Grouped (MoE, rows sorted by expert, `counts` [E], weights [E, N, K]): `grouped_gemm_triton` walks a
  device-built tile schedule with no host sync; exact. torch._grouped_mm refuses out_dtype=float32 for bf16
  (torch 2.11), so a cuBLAS/CUTLASS grouped path cannot stay exact: dispatch uses the Triton kernel. Measured
  vs bf16 _grouped_mm (T tokens x top-8, E=128): gate_up N1536 K2048 T4096 1.161 vs 0.492 ms, T16384 1.950 vs
  1.279 ms; down N2048 K768 T4096 0.726 vs 0.298 ms, T16384 1.517 vs 0.767 ms — the 128x256 tile is too large
  for ~256-1024 rows per expert (many partial tiles); a per-shape tile sweep is the next step.
Whole W4A4 linear forward (activation row-dynamic quantize emitting the bf16 copy + GEMM + scales, weights
prepared): 1.074 ms = 1.45x bf16 at 16384x4096x4096 (target <= 1.10x: NOT met); 1.846 ms = 1.27x at 8192^3.
The gap is the quantizer (0.24 ms, 30% of copy bandwidth) plus the fp32 epilogue round trip (~0.09 ms).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref

# Hopper tile for bf16 wgmma; (128, 256, 64) x 3 stages x 8 warps is the usual best for large squares on
# H100/H200 (Triton's matmul tutorial configs); re-checked by the bench's config sweep.
GEMM_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)


@dataclass
class DqOperand:
    """A quantized operand as the Hopper GEMM consumes it. values_bf16 = e2m1(q)*sf [R, K] (or [E, R, K]);
    global_scale = fp32 S_dec, [] / [E] per tensor or [R, 1] / [E, R, 1] per row."""

    values_bf16: torch.Tensor
    global_scale: torch.Tensor


def dq_operand(t: ref.NVFP4Tensor) -> DqOperand:
    """Dequantize once (e.g. weights per optimizer step): exact bf16 e2m1(q)*sf plus S_dec."""
    return DqOperand(ref.dequantize_unscaled(t).to(torch.bfloat16), t.global_scale)


# ----------------------------------------------------------------------------------------------- kernels
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dot(a, b, acc, INTERPRET: tl.constexpr):
    """bf16 tensor-core dot. Triton 3.6's interpreter multiplies bf16 dot operands as raw bits (wrong), so
    under TRITON_INTERPRET the (exact) operands are widened to fp32 and multiplied in IEEE fp32 instead."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _epilogue(acc, sa_ptr, sb_ptr, rm, rn, M, N, SA_ROW: tl.constexpr, SB_ROW: tl.constexpr):
    if SA_ROW:
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None]
    else:
        sa = tl.load(sa_ptr)
    if SB_ROW:
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        sb = tl.load(sb_ptr)
    return acc * (sa * sb)


@triton.jit
def _gemm_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr,
    M, N, K: tl.constexpr, stride_am, stride_bn, stride_cm,
    SA_ROW: tl.constexpr, SB_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERPRET: tl.constexpr = False,
):
    # C[M, N] = (A[M, K] @ B[N, K]^T) * S_a * S_b ; grouped launch order for L2 reuse
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
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + bn[None, :] * stride_bn + rk[:, None]  # (BK, BN) view of B^T
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + rk) < K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        acc = _dot(a, b, acc, INTERPRET)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    out = _epilogue(acc, sa_ptr, sb_ptr, rm, rn, M, N, SA_ROW, SB_ROW)
    cmask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :], out.to(c_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, tile_expert_ptr, tile_row_ptr, offs_ptr, num_tiles_ptr,
    N, K: tl.constexpr, stride_am, stride_be, stride_bn, stride_cm, stride_sbe,
    SA_ROW: tl.constexpr, SB_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr = False,
):
    # rows of A sorted by expert; tile t covers rows [tile_row[t], min(+BLOCK_M, offs[e+1])) of expert e
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_t >= tl.load(num_tiles_ptr):
        return
    e = tl.load(tile_expert_ptr + pid_t)
    row0 = tl.load(tile_row_ptr + pid_t)
    row_end = tl.load(offs_ptr + e + 1)
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = tl.where(rm < row_end, rm, row0).to(tl.int64)
    bn = tl.where(rn < N, rn, 0).to(tl.int64)
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + e.to(tl.int64) * stride_be + bn[None, :] * stride_bn + rk[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + rk) < K
        a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        acc = _dot(a, b, acc, INTERPRET)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    out = _epilogue(acc, sa_ptr, sb_ptr + e * stride_sbe, rm, rn, row_end, N, SA_ROW, SB_ROW)
    cmask = (rm[:, None] < row_end) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :], out.to(c_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _scale_cast_kernel(acc_ptr, c_ptr, sa_ptr, sb_ptr, row_expert_ptr, M, N, stride_sbe,
                       SA_ROW: tl.constexpr, SB_ROW: tl.constexpr, GROUPED: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Epilogue for the cuBLAS path: c = acc_fp32 * S_a * S_b[expert(row)] cast to c's dtype."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    idx = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.load(acc_ptr + idx, mask=mask, other=0.0)
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None] if SA_ROW else tl.load(sa_ptr)
    if GROUPED:
        e = tl.load(row_expert_ptr + rm, mask=rm < M, other=0).to(tl.int64)[:, None]
        if SB_ROW:
            sb = tl.load(sb_ptr + e * stride_sbe + rn[None, :], mask=mask, other=0.0)
        else:
            sb = tl.load(sb_ptr + e * stride_sbe, mask=rm[:, None] < M, other=0.0)
    else:
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :] if SB_ROW else tl.load(sb_ptr)
    tl.store(c_ptr + idx, (acc * (sa * sb)).to(c_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------- launchers
def _scales(a: DqOperand, b: DqOperand, m: int, n: int):
    sa, sb = a.global_scale.float().contiguous(), b.global_scale.float().contiguous()
    sa_row, sb_row = sa.numel() > 1 or sa.ndim == 2, sb.numel() > 1 or sb.ndim == 2
    return sa, sb, sa_row, sb_row


def gemm_triton(a: DqOperand, b: DqOperand, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = (a_hat @ b_hat^T) with a [M, K], b [N, K] (dequantized bf16 + S_dec)."""
    cfg = dict(GEMM_CONFIG, **(config or {}))
    x, w = a.values_bf16, b.values_bf16
    m, k = x.shape
    n = w.shape[0]
    sa, sb, sa_row, sb_row = _scales(a, b, m, n)
    c = torch.empty(m, n, dtype=out_dtype, device=x.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _gemm_kernel[grid](x, w, c, sa, sb, m, n, k, x.stride(0), w.stride(0), c.stride(0),
                       SA_ROW=sa_row, SB_ROW=sb_row, INTERPRET=INTERPRET, **cfg)
    return c


def _schedule(counts: torch.Tensor, block_m: int, total_rows: int):
    """Device-side tile schedule for the grouped GEMM (no host sync): for each tile its expert and first row."""
    counts = counts.to(torch.int64)
    e = counts.numel()
    offs = torch.zeros(e + 1, dtype=torch.int64, device=counts.device)
    offs[1:] = torch.cumsum(counts, 0)
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    max_tiles = triton.cdiv(total_rows, block_m) + e  # upper bound, fixed from shapes
    t = torch.arange(max_tiles, device=counts.device)
    tile_expert = torch.searchsorted(tile_end, t, right=True).clamp(max=e - 1)
    tile_row = offs[tile_expert] + (t - (tile_end[tile_expert] - tiles[tile_expert])) * block_m
    return (tile_expert.to(torch.int32), tile_row.to(torch.int64), offs, tile_end[-1:].to(torch.int64), max_tiles)


def grouped_gemm_triton(a: DqOperand, b: DqOperand, counts: torch.Tensor, out_dtype=torch.bfloat16,
                        config: dict | None = None) -> torch.Tensor:
    """MoE expert GEMM. a: [T, K] rows sorted by expert; b: [E, N, K], S_dec [E] or [E, N, 1]; counts [E]."""
    cfg = dict(GEMM_CONFIG, **(config or {}))
    cfg.pop("GROUP_M", None)
    x, w = a.values_bf16, b.values_bf16
    t_rows, k = x.shape
    e, n, _ = w.shape
    sa = a.global_scale.float().contiguous()
    sa_row = sa.numel() > 1 or sa.ndim == 2
    sb = b.global_scale.float().reshape(e, -1).contiguous()  # (E, 1) per tensor or (E, N) per row
    sb_row = sb.shape[1] > 1
    c = torch.empty(t_rows, n, dtype=out_dtype, device=x.device)
    if t_rows == 0:
        return c
    tile_expert, tile_row, offs, num_tiles, max_tiles = _schedule(counts, cfg["BLOCK_M"], t_rows)
    grid = (max_tiles, triton.cdiv(n, cfg["BLOCK_N"]))
    _grouped_gemm_kernel[grid](x, w, c, sa, sb, tile_expert, tile_row, offs, num_tiles,
                               n, k, x.stride(0), w.stride(0), w.stride(1), c.stride(0), sb.stride(0),
                               SA_ROW=sa_row, SB_ROW=sb_row, INTERPRET=INTERPRET, **cfg)
    return c


def _scale_cast(acc, sa, sb, sa_row, sb_row, out_dtype, row_expert=None, stride_sbe=0):
    m, n = acc.shape
    c = torch.empty(m, n, dtype=out_dtype, device=acc.device)
    grid = (triton.cdiv(m, 32), triton.cdiv(n, 128))
    _scale_cast_kernel[grid](acc, c, sa, sb, acc if row_expert is None else row_expert, m, n, stride_sbe,
                             SA_ROW=sa_row, SB_ROW=sb_row, GROUPED=row_expert is not None,
                             BLOCK_M=32, BLOCK_N=128, num_warps=4)
    return c


def gemm_cublas(a: DqOperand, b: DqOperand, out_dtype=torch.bfloat16) -> torch.Tensor:
    """cuBLAS bf16 GEMM with fp32 output (torch.mm out_dtype), then the scale epilogue as a second kernel."""
    x, w = a.values_bf16, b.values_bf16
    sa, sb, sa_row, sb_row = _scales(a, b, x.shape[0], w.shape[0])
    acc = torch.mm(x, w.t(), out_dtype=torch.float32)
    return _scale_cast(acc, sa, sb, sa_row, sb_row, out_dtype)


def grouped_gemm_cublas(a: DqOperand, b: DqOperand, counts: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """torch._grouped_mm (CUTLASS on sm90), then the per-expert scale epilogue. NOT exact: torch 2.11 refuses
    out_dtype=float32 for bf16 inputs (measured on the H200), so the accumulator is rounded to bf16 before the
    scales — two roundings (<= 1 bf16 ulp). Kept as a timing comparison; `dispatch` uses the Triton kernel."""
    x, w = a.values_bf16, b.values_bf16
    e = w.shape[0]
    offs = torch.cumsum(counts.to(torch.int32), 0, dtype=torch.int32)
    acc = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)  # bf16 out (fp32 out is refused)
    sa = a.global_scale.float().contiguous()
    sb = b.global_scale.float().reshape(e, -1).contiguous()
    row_expert = torch.repeat_interleave(torch.arange(e, device=x.device, dtype=torch.int32), counts.long(),
                                         output_size=x.shape[0])
    return _scale_cast(acc, sa, sb, sa.numel() > 1 or sa.ndim == 2, sb.shape[1] > 1, out_dtype, row_expert, sb.stride(0))


# ----------------------------------------------------------------------------------------------- references
def gemm_reference(a: ref.NVFP4Tensor, b: ref.NVFP4Tensor, out_dtype=torch.float32) -> torch.Tensor:
    """Plain torch: dequantize both fully in fp32 and multiply in fp32 (float64 when on CPU for a tight check)."""
    return (ref.dequantize(a) @ ref.dequantize(b).t()).to(out_dtype)


def grouped_gemm_reference(a: ref.NVFP4Tensor, b_experts: list[ref.NVFP4Tensor], counts, out_dtype=torch.float32):
    """Per-expert loop over `gemm_reference`; rows of `a` sorted by expert."""
    x = ref.dequantize(a)
    outs, start = [], 0
    for e, cnt in enumerate(torch.as_tensor(counts).tolist()):
        outs.append(x[start:start + cnt] @ ref.dequantize(b_experts[e]).t())
        start += cnt
    return torch.cat(outs, 0).to(out_dtype)
