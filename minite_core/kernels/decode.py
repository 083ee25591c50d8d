"""Packed-weight GEMMs: y = x @ W_hat^T reading NVFP4 weights as codes + E4M3 scales (dequantized in the main loop).

At decode (a few rows per GEMM) a linear layer streams its weights once and does almost no arithmetic per byte, so
time is bytes: bf16 weights are 2 B/element, NVFP4 weights 0.5 + 1/16 = 0.5625 B/element (codes + e4m3 scales),
an ideal 3.56x fewer bytes. Two things keep a kernel from that limit (METHOD.md: time one stage left out): too
few bytes in flight (a few N-tile programs walking all of K), and the dequantization's integer work per weight.
This kernel answers both:
- split-K: the grid is (N tiles, row tiles, K slices); each program streams one K slice of one N tile, so
  enough programs are resident to keep HBM busy. The fp32 partials go to a workspace and the last program of a
  tile (an atomic ticket) adds them in ascending slice order and applies the epilogue: deterministic, one launch,
  capturable (the tickets return to zero at the end of every launch).
- dequantization on byte pairs: no nibble join. A byte holds an even column (low nibble) and an odd column (high
  nibble), so the kernel multiplies the even columns of x by the low nibbles and the odd columns by the high
  ones (two tensor-core dots a K chunk). On the GPU one inline-PTX routine turns 4 code bytes into 8 16-bit floats
  (byte permute, shift and mask: the e2m1 bits land in a 16-bit float's exponent/mantissa, its value times a
  fixed power of two), then one multiply by the block scale. W4A4 (fused activation quantizer) runs the dot in
  fp16: both x̂ = e2m1·e4m3 and ŵ·2^-14 are exact there (<= 6 significant bits, >= 2^-24), so the products are the
  bf16 ones; W4A16 keeps bf16 (x is any bf16) with ŵ·2^-7. The power of two comes back exactly in the epilogue.
  Under TRITON_INTERPRET (CPU) the same values come from plain integer/fp32 arithmetic (`_e2m1_to_fp32`).

Activation kinds (`ACT`):
- 0, as given: x bf16 times an optional S_x (per row or tensor): W4A16 (vLLM's Marlin on Hopper) with S_x = 1,
  or W4A4 on an already-quantized activation (x = e2m1(q_x)·sf_x, S_x its S_dec);
- 1, fused quantizer: x (bf16/fp32) is quantized to NVFP4 in registers (1x16 blocks, RNE, `exact` or `fast`,
  `kernels.quantize.quantize_dq_tile`, codes equal to the quantize kernel's) from one amax per row given by the
  launcher: per-token dynamic (a row-amax pass), per-tensor static (calibrated) or dynamic (amax of the row
  amaxes) — no separate quantize launch and no bf16 activation copy in memory.
Epilogue: acc * (S_x * S_w), the order of the bf16-copy GEMMs' epilogue (kernels.gemm._epilogue).

Layouts: dense (W [N, K], rows tiled by BLOCK_M) or grouped (`GROUPED`, the MoE's padded sorted layout of
kernels/grouped.py: W [E, N, K] packed, S_w per expert, the device-side tile schedule of `grouped_schedule`):
no per-expert loop, no host sync, static shapes — capturable in a CUDA graph.

Accumulation order (`kernels.reference.packed_gemm_reference` spells it in plain torch): per output element, K is
cut into SPLIT_K slices of whole BLOCK_K chunks; in a slice, chunk by chunk in ascending K, the even columns' dot
then the odd columns' dot (fp32, tl.dot within a dot); then the slices' sums added in ascending slice order.
Deterministic, but not the order of the cuBLAS / Triton GEMMs on bf16 weight copies, so a profile's
`decode_gemm: "packed"` is its own numerics knob (profiles.py). Tiles and SPLIT_K depend on the shape only
(`decode_config`), never on the values: a row's bits depend on the other rows of the call only through the
shape (not batch-invariant; minite-onpolicy keeps its own invariant GEMM).

Measurements (H200, `minite bench kernels --only decode`): results/h200/bench/kernels.json and NOTES.md.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.gemm import INTERPRET, _dot
from minite_core.kernels.grouped import grouped_output
from minite_core.kernels.operands import PackedExperts
from minite_core.kernels.quantize import _global_scales, quantize_dq_tile

# Tiles and split-K by shape (`decode_config`). (BLOCK_N, BLOCK_K, warps, stages): H200 sweep in
# results/h200/bench/NOTES.md; PROGRAMS_PER_SM: how many programs split-K aims for (enough loads in flight).
DECODE_CONFIG = dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
PROGRAMS_PER_SM = 4
MAX_SPLIT_K = 16
_SMS: dict = {}
_TICKETS: dict = {}  # per device: int32 counters, all zero between launches
TICKETS = 1 << 16  # ticket slots per device (a launch needs one per output tile)

# 4 code bytes -> 8 16-bit floats whose values are e2m1(code) * 2^-BIAS (inline PTX, one routine a 32-bit word).
# t0 / t1 = bytes (b0, b1) / (b2, b3) spread to the two 16-bit halves (prmt); the low nibble's 3 magnitude bits
# are shifted to the float's lowest exponent bits + top mantissa bit, its sign bit to bit 15 (and the same for the
# high nibble): e2m1 0.5 lands on the float's subnormal 2^-BIAS-1, exactly. Outputs: $0,$1 = low nibbles of
# (b0, b1), (b2, b3); $2,$3 = high nibbles. bf16: BIAS = 126; fp16: BIAS = 14.
_PLACE = """{{
.reg .b32 t0, t1, z, a, b;
mov.b32 z, 0;
prmt.b32 t0, $4, z, 0x4140;
prmt.b32 t1, $4, z, 0x4342;
shl.b32 a, t0, {lo}; and.b32 a, a, {mag}; shl.b32 b, t0, 12; and.b32 b, b, 0x80008000; or.b32 $0, a, b;
shl.b32 a, t1, {lo}; and.b32 a, a, {mag}; shl.b32 b, t1, 12; and.b32 b, b, 0x80008000; or.b32 $1, a, b;
shl.b32 a, t0, {hi}; and.b32 a, a, {mag}; shl.b32 b, t0, 8; and.b32 b, b, 0x80008000; or.b32 $2, a, b;
shl.b32 a, t1, {hi}; and.b32 a, a, {mag}; shl.b32 b, t1, 8; and.b32 b, b, 0x80008000; or.b32 $3, a, b;
}}"""
PLACE_BF16 = tl.constexpr(_PLACE.format(lo=6, hi=2, mag="0x01C001C0"))
PLACE_FP16 = tl.constexpr(_PLACE.format(lo=9, hi=5, mag="0x0E000E00"))


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
def _scaled(v, sf, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """v (BN, BK/2) times its block scale sf (BN, BK/16): 8 of a half's columns share one 16-column block."""
    return tl.reshape(tl.reshape(v, [BLOCK_N, BLOCK_K // 16, 8]) * sf[:, :, None], [BLOCK_N, BLOCK_K // 2])


@triton.jit
def _dequant_halves(wq, ws, PLACED: tl.constexpr, MMA16: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """Packed bytes wq (BN, BK/2) uint8 + scale bytes ws (BN, BK/16) -> (even columns, odd columns) of ŵ in the
    dot's dtype, times 2^-EXP (`_EPI` gives it back): exact (e2m1 x e4m3 has <= 6 significant bits)."""
    sf = _e4m3_to_fp32(ws.to(tl.int32))
    if PLACED:  # inline PTX (GPU): 16-bit floats e2m1 * 2^-BIAS, one multiply by the scale
        if MMA16:  # fp16: e2m1 * 2^-14 * sf, a multiple of 2^-24 below 0.17: exact in fp16
            lo, hi = tl.inline_asm_elementwise(PLACE_FP16, "=r,=r,=r,=r,r", [wq], dtype=(tl.float16, tl.float16),
                                               is_pure=True, pack=4)
            s16 = sf.to(tl.float16)
            w_even = _scaled(lo, s16, BLOCK_N, BLOCK_K)
            w_odd = _scaled(hi, s16, BLOCK_N, BLOCK_K)
        else:
            lo, hi = tl.inline_asm_elementwise(PLACE_BF16, "=r,=r,=r,=r,r", [wq],
                                               dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
            s = sf * 6.646139978924579e35  # 2^119: e2m1 * 2^-126 * sf * 2^119 = ŵ * 2^-7, a bf16 normal
            w_even = _scaled(lo.to(tl.float32), s, BLOCK_N, BLOCK_K).to(tl.bfloat16)
            w_odd = _scaled(hi.to(tl.float32), s, BLOCK_N, BLOCK_K).to(tl.bfloat16)
    else:
        b = wq.to(tl.int32)
        dt: tl.constexpr = tl.float16 if MMA16 else tl.bfloat16
        w_even = _scaled(_e2m1_to_fp32(b & 15), sf, BLOCK_N, BLOCK_K).to(dt)
        w_odd = _scaled(_e2m1_to_fp32((b >> 4) & 15), sf, BLOCK_N, BLOCK_K).to(dt)
    return w_even, w_odd


@triton.jit
def _packed_kernel(
    x_ptr, wq_ptr, ws_ptr, y_ptr, sx_ptr, sw_ptr, part_ptr, ticket_ptr,
    tile_expert_ptr, tile_row_ptr, offs_ptr, num_tiles_ptr,
    M, N, K, K_SLICE, stride_xm, stride_ym, stride_swe, stride_wq, stride_ws,
    ACT: tl.constexpr, HAS_SX: tl.constexpr, SX_ROW: tl.constexpr, SW_ROW: tl.constexpr, FAST: tl.constexpr,
    GROUPED: tl.constexpr, SPLIT_K: tl.constexpr, PLACED: tl.constexpr, MMA16: tl.constexpr, EPI: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr = False,
):
    # x [M, K]; W packed: wq [(E,) N, K/2] uint8, ws [(E,) N, K/16] e4m3 bytes (row strides passed on their own so
    # Triton's divisibility-by-16 specialization sees them: 16-byte code loads); y [M, N]. ACT=1: sx = amax per row.
    # part [SPLIT_K, grid_m * BLOCK_M, N] fp32 partials; ticket [grid_m * grid_n] int32 (zero between launches)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
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
    xdt = tl.float16 if MMA16 else tl.bfloat16
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # yᵀ tile: the weights are the dot's A operand
    k_start = pid_k * K_SLICE
    for k0 in range(k_start, tl.minimum(k_start + K_SLICE, K), BLOCK_K):
        x_ptrs = x_ptr + xm[:, None] * stride_xm + (k0 + rk)[None, :]
        wq_ptrs = wq_ptr + w_row[:, None] * stride_wq + (k0 // 2 + rk2)[None, :]
        ws_ptrs = ws_ptr + w_row[:, None] * stride_ws + (k0 // 16 + rk16)[None, :]
        if EVEN_K:  # no K mask: 16-byte loads of the codes
            x = tl.load(x_ptrs)
            wq = tl.load(wq_ptrs)  # (BN, BK/2)
            ws = tl.load(ws_ptrs)  # (BN, BK/16)
        else:
            x = tl.load(x_ptrs, mask=(k0 + rk)[None, :] < K, other=0.0)
            wq = tl.load(wq_ptrs, mask=(k0 // 2 + rk2)[None, :] < K // 2, other=0)
            ws = tl.load(ws_ptrs, mask=(k0 // 16 + rk16)[None, :] < K // 16, other=0)
        if ACT == 1:
            x = quantize_dq_tile(x.to(tl.float32), s_enc, s_dec, FAST, BLOCK_M, BLOCK_K)
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_K // 2, 2]))
        w_even, w_odd = _dequant_halves(wq, ws, PLACED, MMA16, BLOCK_N, BLOCK_K)
        acc = _dot(w_even, tl.trans(x_even.to(xdt)), acc, INTERPRET)
        acc = _dot(w_odd, tl.trans(x_odd.to(xdt)), acc, INTERPRET)
    acc = acc * EPI  # the dequantization's power of two back (exact)
    out_mask = (rm[None, :] < row_end) & (rn[:, None] < N)  # (BN, BM)
    last = True
    if SPLIT_K > 1:  # partials to the workspace; the last program of the tile adds them in slice order
        tile = pid_m * tl.num_programs(0) + pid_n
        rows_total = tl.num_programs(1) * BLOCK_M
        p_off = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[None, :].to(tl.int64) * N + rn[:, None]
        tl.store(part_ptr + pid_k * rows_total * N + p_off, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before the ticket is taken (release)
        last = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1
        if last:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part_ptr + s * rows_total * N + p_off, mask=out_mask, other=0.0,
                               cache_modifier=".cg")
            tl.atomic_xchg(ticket_ptr + tile, 0)  # back to zero for the next launch (graph replays)
    if last:
        if SW_ROW:
            sw = tl.load(sw_ptr + e * stride_swe + n_safe)[:, None]
        else:
            sw = tl.load(sw_ptr + e * stride_swe)
        if ACT == 1:
            acc = acc * (s_dec[None, :] * sw)
        elif HAS_SX:
            if SX_ROW:
                acc = acc * (tl.load(sx_ptr + xm)[None, :] * sw)
            else:
                acc = acc * (tl.load(sx_ptr) * sw)
        else:
            acc = acc * sw
        tl.store(y_ptr + rm[None, :].to(tl.int64) * stride_ym + rn[:, None], acc.to(y_ptr.dtype.element_ty),
                 mask=out_mask)


# ----------------------------------------------------------------------------------------------- launchers
def _sms(device) -> int:
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return _SMS[device]


def decode_config(m_tiles: int, n: int, k: int, device, config: dict | None = None) -> dict:
    """Launch config of a call: BLOCK_M 16 up to 16 rows a tile (decode), 64 above (then BLOCK_K <= 128); BLOCK_K
    clipped to K; SPLIT_K so that (N tiles x row tiles x slices) reaches PROGRAMS_PER_SM programs an SM, in whole
    chunks. Shapes only (never values); `config` overrides any key (bench sweeps). The interpreter (CPU) takes
    small tiles. PLACED: the inline-PTX dequantization (GPU only)."""
    cfg = dict(DECODE_CONFIG, **(config or {}))
    gpu = not INTERPRET and device.type == "cuda"
    if not gpu:
        cfg.update(BLOCK_N=min(cfg["BLOCK_N"], 16), BLOCK_K=min(cfg["BLOCK_K"], 32))
    bm = cfg.pop("BLOCK_M", None) or 16
    bk = cfg.pop("BLOCK_K")
    bk = max(32, min(bk if bm <= 16 else min(bk, 128), triton.next_power_of_2(k)))  # a dot's K >= 16
    chunks = triton.cdiv(k, bk)
    split = cfg.pop("SPLIT_K", None)
    if split is None:
        tiles = m_tiles * triton.cdiv(n, cfg["BLOCK_N"])
        want = max(1, PROGRAMS_PER_SM * _sms(device) // max(tiles, 1))
        split = min(MAX_SPLIT_K, triton.next_power_of_2(want), chunks)
    split = max(1, min(split, chunks))
    k_slice = triton.cdiv(chunks, split) * bk
    split = triton.cdiv(k, k_slice)  # no empty slice
    return dict(cfg, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split, K_SLICE=k_slice, PLACED=cfg.get("PLACED", gpu))


def _tickets(device, count: int) -> torch.Tensor:
    """The device's zeroed ticket counters (allocated once, outside any graph capture: every launch leaves them
    zero). One stream at a time: two split-K launches in flight on two streams would share tickets."""
    t = _TICKETS.get(device)
    if t is None or t.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split-K decode GEMM: call it once outside CUDA-graph capture first (its ticket "
                               "counters are allocated then)")
        t = _TICKETS[device] = torch.zeros(max(count, TICKETS), dtype=torch.int32, device=device)
    return t


def _launch(x, wq, ws, y, sx, sw, sched, m, n, k, stride_swe, grid_m, *, act, has_sx, sx_row, sw_row, grouped,
            cfg):
    cfg = dict(cfg)
    split, k_slice, placed = cfg.pop("SPLIT_K"), cfg.pop("K_SLICE"), cfg.pop("PLACED")
    mma16 = act is not None  # fused quantizer: x̂ exact in fp16
    epi = (16384.0 if mma16 else 128.0) if placed else 1.0
    grid_n = triton.cdiv(n, cfg["BLOCK_N"])
    if split > 1:
        part = torch.empty(split * grid_m * cfg["BLOCK_M"] * n, dtype=torch.float32, device=x.device)
        tickets = _tickets(x.device, grid_m * grid_n)
    else:
        part = tickets = sw
    tile_expert, tile_row, offs, num_tiles = sched if grouped else (sw, sw, sw, sw)
    _packed_kernel[(grid_n, grid_m, split)](
        x, wq, ws, y, sx, sw, part, tickets, tile_expert, tile_row, offs, num_tiles, m, n, k, k_slice, x.stride(0),
        y.stride(0), stride_swe, k // 2, k // 16, EVEN_K=k % cfg["BLOCK_K"] == 0, ACT=int(act is not None), HAS_SX=has_sx, SX_ROW=sx_row, SW_ROW=sw_row,
        FAST=act is not None and act.math == "fast", GROUPED=grouped, SPLIT_K=split, PLACED=placed, MMA16=mma16,
        EPI=epi, INTERPRET=INTERPRET, **cfg)
    return y


def act_amax(x: torch.Tensor, act, amax=None) -> torch.Tensor:
    """One activation amax per row (fp32 [M], on the device, no host sync) for the fused quantizer: the given
    static amax, the row amaxes (per-token), or their max (per-tensor dynamic)."""
    if act.rounding != "rne" or tuple(act.block) != (1, 16) or act.four_over_six != "off":
        raise ValueError(f"the fused decode quantizer takes 1x16 blocks, RNE, no 4over6; got {act}")
    if amax is not None:
        return amax.float().reshape(-1).expand(x.shape[0]).contiguous()
    from minite_core.kernels.quantize import row_amax

    # decode rows (<= 64): one row a program in 2048-wide chunks — the default 8-row x 256 tile walked a 12,288-wide
    # row in 48 dependent steps, ~6.5 us a call on the H200 (results/h200/bench/NOTES.md row 26)
    rows = row_amax(x, block_m=1, block_k=2048) if x.shape[0] <= 64 else row_amax(x)
    return rows if act.scale_mode == "row" else rows.amax().expand(x.shape[0]).contiguous()


def packed_gemm_triton(x: torch.Tensor, w: ref.NVFP4Tensor, *, act=None, amax=None, x_scale=None,
                       out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = x̂ @ ŵᵀ, W packed [N, K]. act=None: x used as given (bf16) times x_scale (None = 1, [] or
    [M, 1]); act=Quant: x quantized in the kernel (fused), amax = its static scale or None (dynamic)."""
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} and weight {w.shape} disagree on K")
    grid_m = triton.cdiv(m, 16 if m <= 16 else 64)
    cfg = decode_config(grid_m, n, k, x.device, dict(config or {}, **({} if m <= 16 else {"BLOCK_M": 64})))
    x = x.contiguous() if act is not None else x.to(torch.bfloat16).contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    sw = w.global_scale.float().contiguous()
    sx = act_amax(x, act, amax) if act is not None else (sw if x_scale is None else x_scale.float().contiguous())
    return _launch(x, w.data, w.scale.view(torch.uint8), y, sx, sw, None, m, n, k, 0, grid_m, act=act,
                   has_sx=x_scale is not None, sx_row=x_scale is not None and x_scale.ndim == 2, sw_row=sw.ndim == 2,
                   grouped=False, cfg=cfg)


def decode_gemm_triton(x_bf16: torch.Tensor, w: ref.NVFP4Tensor, *, x_scale: torch.Tensor | None = None,
                       out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """y [M, N] = (x_bf16 @ (q_w*sf_w)^T) * S_w (* x_scale): W4A16 when x_scale is None, W4A4 when x_bf16 is
    a quantized activation's e2m1(q)*sf and x_scale its S_dec ([] or [M, 1])."""
    return packed_gemm_triton(x_bf16, w, x_scale=x_scale, out_dtype=out_dtype, config=config)


def grouped_block_m(t_rows: int, experts: int) -> int:
    """Row tile of the grouped packed GEMM: 16 while the experts average <= 64 rows (decode), else 64."""
    return 16 if t_rows <= 64 * experts else 64


def grouped_packed_schedule(offs: torch.Tensor, t_rows: int, experts: int, live: torch.Tensor | None = None,
                            routed: int = 0):
    """The device-side tile schedule (kernels.grouped.grouped_schedule) at this kernel's row tile; build once per
    MoE layer forward. live, routed: the filler past `MoELayout.live_rows` is skipped."""
    from minite_core.kernels.grouped import grouped_schedule

    return grouped_schedule(offs, grouped_block_m(t_rows, experts), t_rows, live, routed)


def grouped_packed_gemm_triton(x: torch.Tensor, w: PackedExperts, offs: torch.Tensor, *, act=None, amax=None,
                               out_dtype=torch.bfloat16, schedule=None, config: dict | None = None) -> torch.Tensor:
    """MoE expert GEMM on the padded sorted layout from packed expert weights: rows offs[e]:offs[e+1] of x
    [Tp, K] times ŵ[e]ᵀ. act=None: x bf16 as is (W4A16); act=Quant: fused quantizer, amax = one per row [Tp]
    (`act_amax` of the layout's scales) — or the static scale."""
    t_rows, k = x.shape
    e, n = w.data.shape[0], w.data.shape[1]
    x = x.contiguous() if act is not None else x.to(torch.bfloat16).contiguous()
    if schedule is None:
        schedule = grouped_packed_schedule(offs, t_rows, e)
    y = grouped_output(schedule, t_rows, n, out_dtype, x.device)
    if t_rows == 0:
        return y
    sw = w.s_dec.float().reshape(e, -1).contiguous()  # (E, 1) per expert tensor or (E, N) per row
    sx = act_amax(x, act, amax) if act is not None else sw
    tile_expert, tile_row, num_tiles, max_tiles, _ = schedule
    cfg = decode_config(max_tiles, n, k, x.device,
                        dict(config or {}, BLOCK_M=grouped_block_m(t_rows, e)))
    return _launch(x, w.data, w.scale.view(torch.uint8), y, sx, sw, (tile_expert, tile_row, offs, num_tiles),
                   t_rows, n, k, sw.stride(0), max_tiles, act=act, has_sx=False, sx_row=False, sw_row=sw.shape[1] > 1,
                   grouped=True, cfg=cfg)
