"""Decode GEMM (M <= 16 rows): y = x @ W_hat^T reading packed NVFP4 weights directly (memory-bound case).

At M <= 16 a linear layer streams its weights once and does almost no arithmetic per byte, so time is bytes:
bf16 weights are 2 B/element, NVFP4 weights 0.5 + 1/16 = 0.5625 B/element (codes + e4m3 scales), an ideal
3.56x fewer bytes. The kernel dequantizes the weight tile in registers (e2m1 bits -> fp32 by placing the 3
magnitude bits at the bottom of the fp32 exponent and rescaling by 2^126, times the decoded e4m3 scale;
exact in bf16) and feeds the tensor cores with x padded to 16 rows. Two activation kinds:
- W4A16 (vLLM's Marlin on Hopper): x is bf16 as given; y = (x @ (q*sf)^T) * S_w.
- W4A4: x is first quantized (`kernels/quantize.py`, emit_dq=True gives e2m1(q_x)*sf_x in bf16), then the same
  kernel runs with the activation's S_dec as a per-row/per-tensor epilogue factor.
The dequantization costs ~6 integer/fp32 ops per weight; on an H200 that is close to the ALU budget of a
memory-bound stream (4.3 TB/s / 0.5625 B = 7.6 Tweights/s over 132 SMs), which is why Marlin-style kernels
use packed bf16x2 tricks.

Measured on the H200 (results/h200/bench, CUDA-graph replays cycling over > 4x L2 of weights, medians):
cuBLAS bf16 0.0137-0.0141 ms at N=K=4096 (2.4 TB/s), 0.0357-0.0360 ms at 8192 (3.7 TB/s). This kernel
(then-default BLOCK_N=32, BLOCK_K=256, 4 warps, 3 stages): 0.0135-0.0150 ms at 4096 and 0.0372-0.0390 ms at
8192, i.e. 0.92-1.04x of cuBLAS — only ~0.7-1.0 TB/s of packed bytes. The >= 2.5x target is NOT met: the
in-register dequantization is ALU-bound as estimated above. Sweep best: (32, 512, 4 warps, 3 stages)
1.04-1.07x at 4096, 0.90-0.97x at 8192 (now the default); (64, 256, 4, 4) 0.92x at M=8 8192.
W4A4 decode (activation quantize + this kernel) 0.041-0.048 ms at 4096 and 0.10-0.11 ms at 8192: the quantize
launch with one program for M <= 16 rows dominates (it loops the whole K twice in one CTA).
Next steps (not done): Marlin-style packed conversion (int32 word -> bf16x2 pairs with LOP3 and one HFMA2
per pair, scale folded), split-K across CTAs for the M <= 16 quantizer.

Split-K is not used: N/BLOCK_N programs each own full rows of W, so the reduction order is fixed
(deterministic) and no fp32 partials are written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.gemm import INTERPRET, _dot

DECODE_CONFIG = dict(BLOCK_N=32, BLOCK_K=512, num_warps=4, num_stages=3)  # H200 sweep, see docstring


@triton.jit
def _e4m3_to_fp32(b):
    """E4M3 byte (int32, sign bit 0) -> fp32, exactly."""
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal step 2^-9


@triton.jit
def _e2m1_to_fp32(c):
    """E2M1 code (int32, 0..15) -> fp32: bits s.e1e0.m land at fp32 bits 31 and 24..22, i.e. the value
    times 2^-126 (exponent e - 127, or subnormal for e == 0), rescaled by an exact 2^126."""
    bits = ((c & 7) << 22) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^126


@triton.jit
def _decode_kernel(
    x_ptr, wq_ptr, ws_ptr, y_ptr, sx_ptr, sw_ptr,
    M, N, K, stride_xm, stride_ym,
    SX_ROW: tl.constexpr, HAS_SX: tl.constexpr, SW_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr = False,
):
    # x [M, K] bf16 (M <= BLOCK_M = 16); W packed: wq [N, K/2] uint8, ws [N, K/16] e4m3 bytes; y [M, N]
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_safe = tl.where(rn < N, rn, 0).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    rk2 = tl.arange(0, BLOCK_K // 2)
    rk16 = tl.arange(0, BLOCK_K // 16)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)  # (BM, BK) bf16
        wq = tl.load(wq_ptr + n_safe[:, None] * (K // 2) + (k0 // 2 + rk2)[None, :],
                     mask=(k0 // 2 + rk2)[None, :] < K // 2, other=0).to(tl.int32)  # (BN, BK/2)
        ws = tl.load(ws_ptr + n_safe[:, None] * (K // 16) + (k0 // 16 + rk16)[None, :],
                     mask=(k0 // 16 + rk16)[None, :] < K // 16, other=0).to(tl.int32)  # (BN, BK/16)
        codes = tl.reshape(tl.join(wq & 15, wq >> 4), [BLOCK_N, BLOCK_K])  # even column = low nibble
        sf = _e4m3_to_fp32(ws)
        w = tl.reshape(tl.reshape(_e2m1_to_fp32(codes), [BLOCK_N, BLOCK_K // 16, 16]) * sf[:, :, None],
                       [BLOCK_N, BLOCK_K]).to(tl.bfloat16)  # exact: e2m1 * e4m3 fits bf16
        acc = _dot(x, tl.trans(w), acc, INTERPRET)
    if SW_ROW:
        acc = acc * tl.load(sw_ptr + rn, mask=rn < N, other=0.0)[None, :]
    else:
        acc = acc * tl.load(sw_ptr)
    if HAS_SX:
        if SX_ROW:
            acc = acc * tl.load(sx_ptr + rm, mask=rm < M, other=0.0)[:, None]
        else:
            acc = acc * tl.load(sx_ptr)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def decode_gemm_triton(x_bf16: torch.Tensor, w: ref.NVFP4Tensor, *, x_scale: torch.Tensor | None = None,
                       out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = (x_bf16 @ (q_w*sf_w)^T) * S_w (* x_scale): W4A16 when x_scale is None, W4A4 when x_bf16 is
    a quantized activation's e2m1(q)*sf and x_scale its S_dec ([] or [M, 1]). M <= 16."""
    cfg = dict(DECODE_CONFIG, **(config or {}))
    m, k = x_bf16.shape
    n = w.shape[0]
    if m > 16:
        raise ValueError(f"decode_gemm handles M <= 16 rows, got x of shape {tuple(x_bf16.shape)}")
    if w.shape[1] != k:
        raise ValueError(f"x {tuple(x_bf16.shape)} and weight {w.shape} disagree on K")
    x_bf16 = x_bf16.to(torch.bfloat16).contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=x_bf16.device)
    sw = w.global_scale.float().contiguous()
    sx = sw if x_scale is None else x_scale.float().contiguous()
    bk = max(16, min(cfg.pop("BLOCK_K"), triton.next_power_of_2(k)))
    grid = (triton.cdiv(n, cfg["BLOCK_N"]),)
    _decode_kernel[grid](x_bf16, w.data, w.scale.view(torch.uint8), y, sx, sw, m, n, k, x_bf16.stride(0), y.stride(0),
                         SX_ROW=x_scale is not None and x_scale.ndim == 2, HAS_SX=x_scale is not None,
                         SW_ROW=sw.ndim == 2, BLOCK_M=16, BLOCK_K=bk, INTERPRET=INTERPRET, **cfg)
    return y
