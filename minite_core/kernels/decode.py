"""Packed-weight GEMMs: y = x @ W_hat^T reading NVFP4 weights as codes + E4M3 scales (dequantized in the main loop).

At decode (a few rows per GEMM) a linear layer streams its weights once and does almost no arithmetic per byte, so
time is bytes: bf16 weights are 2 B/element, NVFP4 weights 0.5 + 1/16 = 0.5625 B/element (codes + e4m3 scales),
an ideal 3.56x fewer bytes. The kernel dequantizes the weight tile in registers (e2m1 bits -> fp32 by placing the
3 magnitude bits at the bottom of the fp32 exponent and rescaling by 2^126, times the decoded e4m3 scale; exact
in bf16) and feeds the tensor cores. Activation kinds (`ACT`):
- 0, as given: x bf16 times an optional S_x (per row or tensor): W4A16 (vLLM's Marlin on Hopper) with S_x = 1,
  or W4A4 on an already-quantized activation (x = e2m1(q_x)·sf_x, S_x its S_dec);
- 1, fused quantizer: x (bf16/fp32) is quantized to NVFP4 in registers in the main loop (1x16 blocks, RNE,
  `exact` or `fast`, `kernels.quantize.quantize_dq_tile`, codes equal to the quantize kernel's) from one amax
  per row given by the launcher: per-token dynamic (a row-amax pass), per-tensor static (calibrated) or
  dynamic (amax of the row amaxes) — the W4A4 decode of `vllm-nvfp4` and `minite` with no separate quantize
  launch and no bf16 activation copy in memory. Every N-tile program re-quantizes its rows (M x K, small).
Epilogue: acc * (S_x * S_w), the order of the bf16-copy GEMMs' epilogue (kernels.gemm._epilogue).

Layouts: dense (W [N, K], rows tiled by BLOCK_M) or grouped (`GROUPED`, the MoE's padded sorted layout of
kernels/grouped.py: W [E, N, K] packed, S_w per expert, the device-side tile schedule of `grouped_schedule`):
no per-expert loop, no host sync, static shapes — capturable in a CUDA graph.

Accumulation order: per output element, fp32 over K in BLOCK_K chunks in ascending order (tl.dot within a
chunk), no split-K: deterministic, but not the order of the cuBLAS / Triton GEMMs on bf16 weight copies (another
tile shape), so a profile's `decode_gemm: "packed"` is its own numerics knob (profiles.py).
`kernels.reference.packed_gemm_reference` is this kernel's block order in plain torch.

Measured on the H200 before the fused quantizer (results/h200/bench, CUDA-graph replays cycling over > 4x L2 of
weights, medians): cuBLAS bf16 0.0137-0.0141 ms at N=K=4096 (2.4 TB/s), 0.0357-0.0360 ms at 8192 (3.7 TB/s).
This kernel (then-default BLOCK_N=32, BLOCK_K=256, 4 warps, 3 stages): 0.0135-0.0150 ms at 4096 and
0.0372-0.0390 ms at 8192, i.e. 0.92-1.04x of cuBLAS — only ~0.7-1.0 TB/s of packed bytes: the in-register
dequantization is ALU-bound (~6 integer/fp32 ops per weight; 4.3 TB/s / 0.5625 B = 7.6 Tweights/s over 132 SMs).
Sweep best: (32, 512, 4 warps, 3 stages) 1.04-1.07x at 4096, 0.90-0.97x at 8192 (now the default).
W4A4 decode with a separate quantize launch: 0.041-0.048 ms at 4096 and 0.10-0.11 ms at 8192 (the quantize launch
dominated; hence the fused quantizer, to be measured). Next steps (not done): Marlin-style packed conversion
(int32 word -> bf16x2 pairs with LOP3 and one HFMA2 per pair, scale folded).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.gemm import INTERPRET, _dot
from minite_core.kernels.operands import PackedExperts
from minite_core.kernels.quantize import _global_scales, quantize_dq_tile

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
def _packed_kernel(
    x_ptr, wq_ptr, ws_ptr, y_ptr, sx_ptr, sw_ptr, tile_expert_ptr, tile_row_ptr, offs_ptr, num_tiles_ptr,
    M, N, K, stride_xm, stride_ym, stride_swe,
    ACT: tl.constexpr, HAS_SX: tl.constexpr, SX_ROW: tl.constexpr, SW_ROW: tl.constexpr, FAST: tl.constexpr,
    GROUPED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr = False,
):
    # x [M, K]; W packed: wq [(E,) N, K/2] uint8, ws [(E,) N, K/16] e4m3 bytes; y [M, N]. ACT=1: sx = amax per row
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    if GROUPED:  # tile pid_m: rows [tile_row, min(+BLOCK_M, offs[e+1])) of expert e
        if pid_m >= tl.load(num_tiles_ptr):
            return
        e = tl.load(tile_expert_ptr + pid_m).to(tl.int64)
        row0 = tl.load(tile_row_ptr + pid_m)
        row_end = tl.load(offs_ptr + e + 1)
    else:
        e = 0
        row0 = pid_m * BLOCK_M
        row_end = M
    rm = row0 + tl.arange(0, BLOCK_M)
    xm = tl.where(rm < row_end, rm, row0).to(tl.int64)  # clamp rows: loads stay in bounds, stores are masked
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_safe = tl.where(rn < N, rn, 0).to(tl.int64)
    w_row = e * N + n_safe  # (BN,) row of the (E*N)-row packed weight
    rk = tl.arange(0, BLOCK_K)
    rk2 = tl.arange(0, BLOCK_K // 2)
    rk16 = tl.arange(0, BLOCK_K // 16)
    if ACT == 1:
        s_enc, s_dec = _global_scales(tl.load(sx_ptr + xm))  # (BM,) per-row global scales of the activation
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + xm[:, None] * stride_xm + (k0 + rk)[None, :], mask=(k0 + rk)[None, :] < K, other=0.0)
        if ACT == 1:
            x = quantize_dq_tile(x.to(tl.float32), s_enc, s_dec, FAST, BLOCK_M, BLOCK_K)
        wq = tl.load(wq_ptr + w_row[:, None] * (K // 2) + (k0 // 2 + rk2)[None, :],
                     mask=(k0 // 2 + rk2)[None, :] < K // 2, other=0).to(tl.int32)  # (BN, BK/2)
        ws = tl.load(ws_ptr + w_row[:, None] * (K // 16) + (k0 // 16 + rk16)[None, :],
                     mask=(k0 // 16 + rk16)[None, :] < K // 16, other=0).to(tl.int32)  # (BN, BK/16)
        codes = tl.reshape(tl.join(wq & 15, wq >> 4), [BLOCK_N, BLOCK_K])  # even column = low nibble
        sf = _e4m3_to_fp32(ws)
        w = tl.reshape(tl.reshape(_e2m1_to_fp32(codes), [BLOCK_N, BLOCK_K // 16, 16]) * sf[:, :, None],
                       [BLOCK_N, BLOCK_K]).to(tl.bfloat16)  # exact: e2m1 * e4m3 fits bf16
        acc = _dot(x.to(tl.bfloat16), tl.trans(w), acc, INTERPRET)
    if SW_ROW:
        sw = tl.load(sw_ptr + e * stride_swe + n_safe)[None, :]
    else:
        sw = tl.load(sw_ptr + e * stride_swe)
    if ACT == 1:
        acc = acc * (s_dec[:, None] * sw)
    elif HAS_SX:
        if SX_ROW:
            acc = acc * (tl.load(sx_ptr + xm)[:, None] * sw)
        else:
            acc = acc * (tl.load(sx_ptr) * sw)
    else:
        acc = acc * sw
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < row_end) & (rn[None, :] < N))


# ----------------------------------------------------------------------------------------------- launchers
def _tiles(m: int, k: int, cfg: dict, device) -> dict:
    """Launch config: BLOCK_M 16 up to 16 rows (decode), 64 above (then BLOCK_K <= 128); BLOCK_K clipped to K;
    the interpreter (CPU) takes small tiles. The chunking of K is the kernel's accumulation order."""
    cfg = dict(cfg)
    if INTERPRET or device.type != "cuda":
        cfg.update(BLOCK_N=min(cfg["BLOCK_N"], 16), BLOCK_K=min(cfg["BLOCK_K"], 32))
    bm = cfg.pop("BLOCK_M", None) or (16 if m <= 16 else 64)
    bk = min(cfg.pop("BLOCK_K"), 128) if bm > 16 else cfg.pop("BLOCK_K")  # a 64 x 512 fp32 tile would spill
    return dict(cfg, BLOCK_M=bm, BLOCK_K=max(16, min(bk, triton.next_power_of_2(k))))


def act_amax(x: torch.Tensor, act, amax=None) -> torch.Tensor:
    """One activation amax per row (fp32 [M], on the device, no host sync) for the fused quantizer: the given
    static amax, the row amaxes (per-token), or their max (per-tensor dynamic)."""
    if act.rounding != "rne" or tuple(act.block) != (1, 16) or act.four_over_six != "off":
        raise ValueError(f"the fused decode quantizer takes 1x16 blocks, RNE, no 4over6; got {act}")
    if amax is not None:
        return amax.float().reshape(-1).expand(x.shape[0]).contiguous()
    from minite_core.kernels.quantize import row_amax

    rows = row_amax(x)
    return rows if act.scale_mode == "row" else rows.amax().expand(x.shape[0]).contiguous()


def packed_gemm_triton(x: torch.Tensor, w: ref.NVFP4Tensor, *, act=None, amax=None, x_scale=None,
                       out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = x̂ @ ŵᵀ, W packed [N, K]. act=None: x used as given (bf16) times x_scale (None = 1, [] or
    [M, 1]); act=Quant: x quantized in the kernel (fused), amax = its static scale or None (dynamic)."""
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} and weight {w.shape} disagree on K")
    cfg = _tiles(m, k, dict(DECODE_CONFIG, **(config or {})), x.device)
    x = x.contiguous() if act is not None else x.to(torch.bfloat16).contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    sw = w.global_scale.float().contiguous()
    sx = act_amax(x, act, amax) if act is not None else (sw if x_scale is None else x_scale.float().contiguous())
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
    _packed_kernel[grid](x, w.data, w.scale.view(torch.uint8), y, sx, sw, sw, sw, sw, sw, m, n, k, x.stride(0),
                         y.stride(0), 0, ACT=int(act is not None), HAS_SX=x_scale is not None,
                         SX_ROW=x_scale is not None and x_scale.ndim == 2, SW_ROW=sw.ndim == 2,
                         FAST=act is not None and act.math == "fast", GROUPED=False, INTERPRET=INTERPRET, **cfg)
    return y


def decode_gemm_triton(x_bf16: torch.Tensor, w: ref.NVFP4Tensor, *, x_scale: torch.Tensor | None = None,
                       out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = (x_bf16 @ (q_w*sf_w)^T) * S_w (* x_scale): W4A16 when x_scale is None, W4A4 when x_bf16 is
    a quantized activation's e2m1(q)*sf and x_scale its S_dec ([] or [M, 1])."""
    return packed_gemm_triton(x_bf16, w, x_scale=x_scale, out_dtype=out_dtype, config=config)


def grouped_block_m(t_rows: int, experts: int) -> int:
    """Row tile of the grouped packed GEMM: 16 while the experts average <= 64 rows (decode), else 64."""
    return 16 if t_rows <= 64 * experts else 64


def grouped_packed_schedule(offs: torch.Tensor, t_rows: int, experts: int):
    """The device-side tile schedule (kernels.grouped.grouped_schedule) at this kernel's row tile; build once per
    MoE layer forward."""
    from minite_core.kernels.grouped import grouped_schedule

    return grouped_schedule(offs, grouped_block_m(t_rows, experts), t_rows)


def grouped_packed_gemm_triton(x: torch.Tensor, w: PackedExperts, offs: torch.Tensor, *, act=None, amax=None,
                               out_dtype=torch.bfloat16, schedule=None, config: dict | None = None) -> torch.Tensor:
    """MoE expert GEMM on the padded sorted layout from packed expert weights: rows offs[e]:offs[e+1] of x
    [Tp, K] times ŵ[e]ᵀ. act=None: x bf16 as is (W4A16); act=Quant: fused quantizer, amax = one per row [Tp]
    (`act_amax` of the layout's scales) — or the static scale."""
    t_rows, k = x.shape
    e, n = w.data.shape[0], w.data.shape[1]
    cfg = _tiles(grouped_block_m(t_rows, e), k, dict(DECODE_CONFIG, **(config or {})), x.device)
    x = x.contiguous() if act is not None else x.to(torch.bfloat16).contiguous()
    y = torch.empty(t_rows, n, dtype=out_dtype, device=x.device)
    if t_rows == 0:
        return y
    sw = w.s_dec.float().reshape(e, -1).contiguous()  # (E, 1) per expert tensor or (E, N) per row
    sx = act_amax(x, act, amax) if act is not None else sw
    if schedule is None:
        schedule = grouped_packed_schedule(offs, t_rows, e)
    tile_expert, tile_row, num_tiles, max_tiles = schedule
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), max_tiles)
    _packed_kernel[grid](x, w.data, w.scale.view(torch.uint8), y, sx, sw, tile_expert, tile_row, offs, num_tiles,
                         t_rows, n, k, x.stride(0), y.stride(0), sw.stride(0), ACT=int(act is not None),
                         HAS_SX=False, SX_ROW=False, SW_ROW=sw.shape[1] > 1,
                         FAST=act is not None and act.math == "fast", GROUPED=True, INTERPRET=INTERPRET, **cfg)
    return y
