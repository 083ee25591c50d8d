"""Grouped (MoE) NVFP4 GEMMs for Hopper, exact: bf16 tensor cores on dequantized operands, fp32 epilogue.

Layout (what `nn.moe_layout` builds): the routed rows of a MoE layer sorted by expert into one buffer of Tp rows,
each expert's segment starting at a multiple of 16 (zero pad rows between), the last segment running to Tp;
`offs` [E + 1] (int64, on the device) holds the segment starts and offs[E] = Tp. Nothing here reads the layout
on the host: tile schedules are built on the device from `offs` with a shape-only upper bound on the tile
count, so a grouped GEMM never syncs (and can be captured in a CUDA graph).

Three kernels:
- `grouped_gemm`  (forward and dgrad)  y[t] = (a[t] @ b[e(t)]ᵀ) · S_a[t] · S_b[e(t)]   a [Tp, K], b [E, N, K]
  — and `grouped_gemm_quant`, the same kernel with a = the raw activation quantized in its prologue
  (kernels/quant_prologue.py: x̂ never goes to memory; bit for bit the separate quantize pass + `grouped_gemm`);
- `kgrouped_gemm` (wgrad)              w[e] = (a[:, seg_e] @ b[:, seg_e]ᵀ) · S_a[e] · S_b[e]   a [N, Tp], b [K, Tp]
  — the reduction runs over each expert's own tokens, so the along-token quantization blocks of both operands
  (16 tokens, aligned to the segment start) are exactly the per-expert reference's — and `kgrouped_gemm_quant`,
  the same kernel with a = dyᵀ quantized along tokens (RHT, SR) in its prologue from the raw dy [Tp, N]
  (kernels/quant_prologue.py `t_tile`: bit for bit the separate `quantize_cols` pass + `kgrouped_gemm`);
- `dequantize_triton`: packed codes + E4M3 scales -> bf16 e2m1(q)·sf (the saved, packed wgrad operand expanded
  right before its GEMM).
Why not torch._grouped_mm for NVFP4: on torch 2.11 it refuses out_dtype=float32 for bf16 inputs (measured on the
H200), so the fp32 accumulator would be rounded to bf16 before the global scales — two roundings, not exact.
The bf16 profile does use torch._grouped_mm (what MoE users run; `nn.experts`).

Accumulation: fp32 in Triton's dot order (fixed per config), so results agree with the plain-torch references
below to fp32 accumulation order (tests/test_kernels.py's TOL["gemm_rel"]).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.gemm import INTERPRET, _dot, _dot_rows
from minite_core.kernels.operands import DqOperand
from minite_core.kernels.quant_prologue import a_scales, a_stream, a_tile, check_a, t_scales, t_tile
from minite_core.kernels.quantize import decode_scale
from minite_core.kernels.quantize_cols import _rht_bf16

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages); the H200 sweep in bench/kernels.py ("grouped-tile") re-measures.
# H200 sweep (results/h200/bench, T16384x8 E128 N1536 K2048): 128-256-64 w8 s3 1.61 ms; 64-256-64 w8 s4 1.96;
# 128-128-64 w8 s4 2.21; 64-128-64 w4 s4 2.17; 128-128-128 w8 s3 2.27 (torch._grouped_mm bf16: 1.28 ms).
GROUPED_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)
# wgrad sweep (H200, T16384x8 E128, 2026-12-03): 128-256-64 w8 s3 gate_up 1.72 ms / down 0.93 (0.78x / 0.76x
# _grouped_mm); 128-128-64 w8 s4 2.81 / 1.43; 64-128-64 w4 s4 2.43 / 1.31;
# 128-128-128 w8 s3 2.59 / 1.44
KGROUPED_CONFIG = dict(BLOCK_N=128, BLOCK_K=256, BLOCK_T=64, num_warps=8, num_stages=3)
SMALL = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=1)  # interpreter / tiny shapes
SMALL_K = dict(BLOCK_N=32, BLOCK_K=32, BLOCK_T=16, num_warps=4, num_stages=1)


@triton.jit
def _grouped_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, tile_expert_ptr, tile_row_ptr, offs_ptr, num_tiles_ptr,
    sdec_ptr, seed_ptr, index_ptr,
    N, K, stride_am, stride_be, stride_bn, stride_cm, stride_sbe,
    SA_ROW: tl.constexpr, SB_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr = False,
    ROW_DOT: tl.constexpr = False, QUANT: tl.constexpr = False, FAST: tl.constexpr = False,
    SR: tl.constexpr = False,
):
    # tile t covers rows [tile_row[t], min(+BLOCK_M, offs[e+1])) of expert e = tile_expert[t]
    # QUANT (`grouped_gemm_quant`, kernels/quant_prologue.py): a = the raw x, quantized in the loop; sa = its amax
    # (per row with SA_ROW), S_dec written to sdec; SR draws per-row streams (seed, expert-local row) from seed/index
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
    am = tl.where(rm < row_end, rm, row0).to(tl.int64)  # clamp: loads stay in bounds, stores are masked
    bn = tl.where(rn < N, rn, 0).to(tl.int64)
    if QUANT:
        s_enc, s_dec = a_scales(sa_ptr, sdec_ptr, am, rm < row_end, pid_n == 0, pid_t == 0, SA_ROW, BLOCK_M)
        if SR:
            seed_r, ctr_row = a_stream(seed_ptr, index_ptr, am, 0, True)
        else:
            seed_r, ctr_row = 0, 0
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + e.to(tl.int64) * stride_be + bn[None, :] * stride_bn + rk[:, None]  # (BK, BN) view of Bᵀ
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
        sa = tl.load(sa_ptr + am)[:, None]
    else:
        sa = tl.load(sa_ptr)
    if SB_ROW:
        sb = tl.load(sb_ptr + e * stride_sbe + bn)[None, :]
    else:
        sb = tl.load(sb_ptr + e * stride_sbe)
    out = acc * (sa * sb)
    cmask = (rm[:, None] < row_end) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :], out.to(c_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _kgrouped_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, offs_ptr, amax_ptr, seed_ptr, index_ptr, N, K, stride_a, stride_b,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, INTERPRET: tl.constexpr = False,
    QUANT: tl.constexpr = False, FAST: tl.constexpr = False, SR: tl.constexpr = False, RHT: tl.constexpr = False,
    RHT_BF16: tl.constexpr = False,
):
    # c[e, n, k] = sum_{t in seg_e} a[n, t] * b[k, t] * S_a[e] * S_b[e]; a: (N, Tp), b: (K, Tp), c: (E, N, K) fp32
    # QUANT (`kgrouped_gemm_quant`, kernels/quant_prologue.py `t_tile`): a is the raw dy (Tp, N) (stride_a = its
    # row stride), each (BN, BT) tile of dyᵀ quantized along tokens in the loop with expert e's amax (amax_ptr
    # [E]); sa = S_dec of those amaxes (the launcher's); SR draws the per-token streams seed / index
    # 1D grid, expert-major then n then k: consecutive programs share the expert's a rows and sweep its b, so the
    # expert's operands (a few MB) stay in L2 (an (E, N, K) grid with E fastest re-read them from DRAM: 9-11 ms
    # vs torch._grouped_mm's 1.36 ms at T16384x8 N1536 K2048 on the H200)
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    e = pid // (n_tiles * k_tiles)
    pid_n = (pid // k_tiles) % n_tiles
    pid_k = pid % k_tiles
    # segments start and end at multiples of 16 (nn.moe_layout); the hints let the token-contiguous, token-masked
    # loads vectorise (9.1-9.2 ms on the H200 without them or with t0 alone hinted, same shape as above)
    t0 = tl.multiple_of(tl.load(offs_ptr + e).to(tl.int32), 16)
    t1 = tl.multiple_of(tl.load(offs_ptr + e + 1).to(tl.int32), 16)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rt = tl.arange(0, BLOCK_T)
    an = tl.where(rn < N, rn, 0).to(tl.int64)
    bk = tl.where(rk < K, rk, 0).to(tl.int64)
    if QUANT:  # dyᵀ's (BN, BT) tile read from dy (Tp, N): channel-contiguous, so rn stays unclamped (N masked)
        a_ptrs = a_ptr + (t0 + rt)[None, :].to(tl.int64) * stride_a + rn[:, None]
        s_enc, s_dec = t_scales(amax_ptr, e, BLOCK_N, BLOCK_T)  # (BN, BT / 16), the expert's
    else:
        a_ptrs = a_ptr + an[:, None] * stride_a + (t0 + rt)[None, :]  # (BN, BT)
    b_ptrs = b_ptr + bk[None, :] * stride_b + (t0 + rt)[:, None]  # (BT, BK)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for i in range(0, tl.cdiv(t1 - t0, BLOCK_T)):
        tmask = (t0 + i * BLOCK_T + rt) < t1
        if QUANT:
            a = tl.load(a_ptrs, mask=(rn < N)[:, None] & tmask[None, :], other=0.0)
            a = t_tile(a, s_enc, s_dec, seed_ptr, index_ptr, rn, t0 + i * BLOCK_T, t1, FAST, SR, RHT, RHT_BF16,
                       BLOCK_N, BLOCK_T)
            a_ptrs += BLOCK_T * stride_a
        else:
            a = tl.load(a_ptrs, mask=tmask[None, :], other=0.0)
            a_ptrs += BLOCK_T
        b = tl.load(b_ptrs, mask=tmask[:, None], other=0.0)
        acc = _dot(a, b, acc, INTERPRET)
        b_ptrs += BLOCK_T
    out = acc * (tl.load(sa_ptr + e) * tl.load(sb_ptr + e))
    cmask = (rn[:, None] < N) & (rk[None, :] < K)
    ptrs = c_ptr + e.to(tl.int64) * N * K + rn[:, None].to(tl.int64) * K + rk[None, :]
    tl.store(ptrs, out, mask=cmask)


@triton.jit
def _dequant_kernel(data_ptr, scale_ptr, out_ptr, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out [R, C] bf16 = e2m1(code) * e4m3(scale): exact (<= 6 significant bits)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    r64 = rows.to(tl.int64)[:, None]
    half = tl.program_id(1) * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
    pmask = (rows[:, None] < R) & (half[None, :] < C // 2)
    byte = tl.load(data_ptr + r64 * (C // 2) + half[None, :], mask=pmask, other=0).to(tl.int32)
    codes = tl.reshape(tl.join(byte & 15, byte >> 4), [BLOCK_R, BLOCK_C])  # even column = low nibble
    nb = tl.program_id(1) * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)
    smask = (rows[:, None] < R) & (nb[None, :] < C // 16)
    sf = _e4m3_value(tl.load(scale_ptr + r64 * (C // 16) + nb[None, :], mask=smask, other=0).to(tl.int32))
    mag = (codes & 7)
    val = tl.where(mag < 4, mag.to(tl.float32) * 0.5, tl.where(mag == 7, 6.0, (mag - 2).to(tl.float32)))
    val = tl.where((codes & 8) != 0, -val, val)
    out = tl.reshape(tl.reshape(val, [BLOCK_R, BLOCK_C // 16, 16]) * sf[:, :, None], [BLOCK_R, BLOCK_C])
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    tl.store(out_ptr + r64 * C + cols[None, :], out.to(tl.bfloat16), mask=mask)


@triton.jit
def _e4m3_value(b):
    """E4M3 byte (int32, sign bit 0: block scales are >= 0) -> fp32, exactly."""
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    return tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal step 2^-9


# ----------------------------------------------------------------------------------------------- launchers
class Schedule(NamedTuple):
    """A grouped GEMM's tile schedule, built on the device (`grouped_schedule`)."""
    tile_expert: torch.Tensor  # (max_tiles,) int32: expert of each tile
    tile_row: torch.Tensor  # (max_tiles,) int64: first row of each tile
    num_tiles: torch.Tensor  # (1,) int64: the tiles that run (those past it exit)
    max_tiles: int  # the grid: an upper bound from shapes only
    live: torch.Tensor | None  # (1,) int64: rows past it have no tile and their outputs are written as zeros


@triton.jit
def _schedule_kernel(offs_ptr, live_ptr, expert_ptr, row_ptr, count_ptr, E, MAX_TILES, BM: tl.constexpr,
                     LIVE: tl.constexpr, BLOCK_E: tl.constexpr, T: tl.constexpr):
    # per tile t of this program's T: its expert (#{e : tile_end_e <= t}, clamped to E - 1) and first row
    ex = tl.arange(0, BLOCK_E)
    start = tl.load(offs_ptr + ex, mask=ex < E, other=0)
    end = tl.load(offs_ptr + ex + 1, mask=ex < E, other=0)
    if LIVE:
        end = tl.where(ex == E - 1, tl.load(live_ptr), end)
    tiles = (end - start + BM - 1) // BM  # 0 past E
    tile_end = tl.cumsum(tiles, axis=0)
    if tl.program_id(0) == 0:
        tl.store(count_ptr, tl.sum(tiles, axis=0))
    t = tl.program_id(0) * T + tl.arange(0, T)
    expert = tl.minimum(tl.sum(((tile_end[None, :] <= t[:, None]) & (ex[None, :] < E)).to(tl.int32), axis=1), E - 1)
    hit = ex[None, :] == expert[:, None]  # (T, BLOCK_E)
    first = tl.sum(tl.where(hit, start, 0), axis=1)  # offs[expert]
    first_tile = tl.sum(tl.where(hit, tile_end - tiles, 0), axis=1)
    tl.store(expert_ptr + t, expert, mask=t < MAX_TILES)
    tl.store(row_ptr + t, first + (t - first_tile) * BM, mask=t < MAX_TILES)


def grouped_schedule(offs: torch.Tensor, block_m: int, total_rows: int, live: torch.Tensor | None = None,
                     routed: int = 0) -> Schedule:
    """Device-side tile schedule (no host sync) in one launch: per tile its expert and first row; max_tiles from
    shapes only. live: `MoELayout.live_rows` — the last expert's segment ends there instead of at Tp (its filler, all
    zero rows, gets no tile; the GEMM zero-fills the output instead); routed = the layout's N·k real rows, which then
    bound the tiles (an expert with c rows takes ceil(c / block_m) <= c / block_m + 1 of them). Equal to
    `grouped_schedule_reference` (the same in ~16 torch ops; tests/test_kernels.py)."""
    e = offs.numel() - 1
    max_tiles = _max_tiles(e, block_m, total_rows, live, routed)
    expert = torch.empty(max_tiles, dtype=torch.int32, device=offs.device)
    row = torch.empty(max_tiles, dtype=torch.int64, device=offs.device)
    count = torch.empty(1, dtype=torch.int64, device=offs.device)
    # 32 tiles a program at most: one program over the 72 tiles of 16 tokens x top-8 / 64 experts ((128, 64) int64
    # compares) took 15 us on an H100 (`4461ae1`), one over 9 tiles 2.6 us
    tiles = 16 if max_tiles <= 16 else 32
    _schedule_kernel[(triton.cdiv(max_tiles, tiles),)](
        offs.to(torch.int64), offs if live is None else live, expert, row, count, e, max_tiles, BM=block_m,
        LIVE=live is not None, BLOCK_E=triton.next_power_of_2(max(e, 16)), T=tiles)
    return Schedule(expert, row, count, max_tiles, live)


def _max_tiles(e: int, block_m: int, total_rows: int, live, routed: int) -> int:
    """The schedule's grid: an upper bound of its tiles from shapes only."""
    max_tiles = triton.cdiv(total_rows, block_m) + e
    return max_tiles if live is None else min(max_tiles, triton.cdiv(routed, block_m) + min(e, routed))


def grouped_schedule_reference(offs: torch.Tensor, block_m: int, total_rows: int, live: torch.Tensor | None = None,
                               routed: int = 0) -> Schedule:
    """`grouped_schedule` in torch ops (cumsum, searchsorted, gathers)."""
    offs = offs.to(torch.int64)
    e = offs.numel() - 1
    max_tiles = _max_tiles(e, block_m, total_rows, live, routed)
    if live is not None:
        offs = torch.cat([offs[:-1], live])
    seg = offs[1:] - offs[:-1]
    tiles = (seg + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    t = torch.arange(max_tiles, device=offs.device)
    tile_expert = torch.searchsorted(tile_end, t, right=True).clamp(max=e - 1)
    tile_row = offs[tile_expert] + (t - (tile_end[tile_expert] - tiles[tile_expert])) * block_m
    return Schedule(tile_expert.to(torch.int32), tile_row, tile_end[-1:], max_tiles, live)


def grouped_output(schedule: Schedule, rows: int, n: int, dtype, device) -> torch.Tensor:
    """The [rows, n] output of a grouped GEMM on `schedule`: zeros where it skips the filler, else uninitialized
    (every row gets a tile)."""
    alloc = torch.empty if schedule.live is None else torch.zeros
    return alloc(rows, n, dtype=dtype, device=device)


def _config(default: dict, small: dict, config: dict | None, device) -> dict:
    base = small if (INTERPRET or device.type != "cuda") else default
    return dict(base, **(config or {}))


def grouped_gemm(a: DqOperand, b: DqOperand, offs: torch.Tensor, out_dtype=torch.bfloat16,
                 config: dict | None = None, schedule=None) -> torch.Tensor:
    """y [Tp, N] = a_hat[t] @ b_hat[e(t)]ᵀ. a: [Tp, K] with S_dec [] or [Tp, 1]; b: [E, N, K] with S_dec [E]
    or [E, N, 1]; offs [E + 1] segment starts (offs[E] = Tp)."""
    sa = a.global_scale.float().reshape(-1).contiguous()
    return _grouped_launch(a.values_bf16, sa, sa.numel() > 1, b, offs, out_dtype, config, schedule)[0]


def grouped_gemm_quant(x: torch.Tensor, amax: torch.Tensor, b: DqOperand, offs: torch.Tensor,
                       out_dtype=torch.bfloat16, *, math: str = "exact", rounding: str = "rne",
                       seg_seed: tuple[torch.Tensor, torch.Tensor] | None = None, config: dict | None = None,
                       schedule=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [Tp, N], S_x): `grouped_gemm` with x [Tp, K] (bf16 / fp32, unit stride along K) quantized to 1×16 NVFP4
    in the GEMM's prologue (kernels/quant_prologue.py). amax: [] for the tensor or [Tp] one per row (per-token
    scales, or each expert's amax broadcast to its rows); S_x = S_dec of x̂, [] or [Tp, 1] (rows without a tile,
    the filler past the schedule's `live`, hold 1). math "exact" | "fast"; rounding "rne" | "sr", SR with
    seg_seed = (seed, expert-local row) [Tp] int64 each. Bit for bit `quantize_triton(x, scale_mode="row",
    amax=amax, emit_dq=True, seg_seed=seg_seed)` then `grouped_gemm` on its DqOperand, with the same config."""
    amax, per_row = check_a(x, amax, rounding, math, seg_seed is not None, x.shape[0])
    return _grouped_launch(x, amax, per_row, b, offs, out_dtype, config, schedule, (math, rounding, seg_seed))


def _grouped_launch(x, sa, sa_row: bool, b: DqOperand, offs, out_dtype, config, schedule, quant=None):
    """One `_grouped_kernel` launch; quant = (math, rounding, seg_seed): x raw and sa its amax (QUANT)."""
    w = b.values_bf16
    t_rows, k = x.shape
    e, n, _ = w.shape
    cfg = _config(GROUPED_CONFIG, SMALL, config, x.device)
    sb = b.global_scale.float().reshape(e, -1).contiguous()  # (E, 1) per tensor or (E, N) per row
    schedule = schedule or grouped_schedule(offs, cfg["BLOCK_M"], t_rows)
    c = grouped_output(schedule, t_rows, n, out_dtype, x.device)
    s_x = None
    if quant is not None:
        fill = torch.ones if schedule.live is not None or t_rows == 0 else torch.empty
        s_x = fill((t_rows, 1) if sa_row else (), dtype=torch.float32, device=x.device)
    if t_rows == 0:
        return c, s_x
    math, rounding, seg_seed = quant or ("exact", "rne", None)
    seeds, index = seg_seed or (sa, sa)  # unread without SR
    tile_expert, tile_row, num_tiles, max_tiles, _ = schedule
    grid = (max_tiles, triton.cdiv(n, cfg["BLOCK_N"]))
    _grouped_kernel[grid](x, w, c, sa, sb, tile_expert, tile_row, offs, num_tiles, sa if s_x is None else s_x,
                          seeds, index, n, k, x.stride(0), w.stride(0), w.stride(1), c.stride(0), sb.stride(0),
                          SA_ROW=sa_row, SB_ROW=sb.shape[1] > 1, INTERPRET=INTERPRET, QUANT=quant is not None,
                          FAST=math == "fast", SR=rounding == "sr", **cfg)
    return c, s_x


def kgrouped_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, offs: torch.Tensor,
                  config: dict | None = None) -> torch.Tensor:
    """wgrad: c [E, N, K] fp32 = per expert e, (a[:, seg_e] @ b[:, seg_e]ᵀ) * sa[e] * sb[e].
    a: bf16 [N, Tp] (e2m1·sf along tokens), b: bf16 [K, Tp]; sa, sb: fp32 [E]; offs [E + 1]."""
    return _kgrouped_launch(a, a.shape[0], sa.float().contiguous(), b, sb, offs, config)


def kgrouped_gemm_quant(dy: torch.Tensor, amax: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, offs: torch.Tensor,
                        *, math: str = "exact", rounding: str = "rne",
                        seg_seed: tuple[torch.Tensor, torch.Tensor] | None = None, rht: bool = False,
                        rht_dtype: str = "float32", config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(c [E, N, K] fp32, S_dyᵀ [E]): `kgrouped_gemm` with a = dyᵀ quantized along tokens in the GEMM's prologue
    (kernels/quant_prologue.py `t_tile`), read from dy [Tp, N] (bf16 / fp32, unit stride along N) in place.
    amax [E]: each expert's amax of dy (after the RHT when `rht`: `col_block_amax`'s blocks maxed per expert);
    math "exact" | "fast"; rounding "rne" | "sr", SR with seg_seed = (seed, expert-local token) [Tp] int64 each;
    rht / rht_dtype: TE's RHT over each 16-token block first. Bit for bit `quantize_cols_triton(dy,
    col_amax=amax[expert of each 16-token block], emit_dq=True, ...)` then `kgrouped_gemm` on its bf16 copy with
    sa = `decode_scale(amax)` (returned), with the same config."""
    t_rows, n = dy.shape
    if t_rows % 16 or dy.stride(1) != 1:
        raise ValueError(f"the fused wgrad quantizer takes dy [Tp, N] with Tp % 16 == 0 and unit stride along N, "
                         f"got shape {tuple(dy.shape)} strides {dy.stride()}")
    if math not in ("exact", "fast") or rounding not in ("rne", "sr"):
        raise ValueError(f"bad quantizer settings math={math!r} rounding={rounding!r}")
    if rounding == "sr" and seg_seed is None:
        raise ValueError("rounding='sr' needs seg_seed (per-token seeds and expert-local indices; no hidden RNG)")
    e = offs.numel() - 1
    if amax.numel() != e:
        raise ValueError(f"amax: one per expert [{e}], got shape {tuple(amax.shape)}")
    amax = amax.float().reshape(-1).contiguous()
    s_dec = decode_scale(amax)
    quant = {"amax": amax, "seg_seed": seg_seed, "FAST": math == "fast", "SR": rounding == "sr", "RHT": rht,
             "RHT_BF16": rht and _rht_bf16(rht_dtype)}
    return _kgrouped_launch(dy, n, s_dec, b, sb, offs, config, quant), s_dec


def _kgrouped_launch(a, n: int, sa, b, sb, offs, config, quant: dict | None = None) -> torch.Tensor:
    """One `_kgrouped_kernel` launch; quant = the QUANT branch's inputs and flags (a = the raw dy [Tp, N])."""
    k = b.shape[0]
    e = offs.numel() - 1
    cfg = _config(KGROUPED_CONFIG, SMALL_K, config, a.device)
    if quant is not None and cfg["BLOCK_T"] % 16:
        raise ValueError(f"the fused wgrad quantizer needs whole 16-token blocks a tile, got BLOCK_T={cfg['BLOCK_T']}")
    c = torch.empty(e, n, k, dtype=torch.float32, device=a.device)
    quant = dict(quant or {})
    amax = quant.pop("amax", sa)  # unread without QUANT
    seeds, index = quant.pop("seg_seed", None) or (sa, sa)  # unread without SR
    grid = (e * triton.cdiv(n, cfg["BLOCK_N"]) * triton.cdiv(k, cfg["BLOCK_K"]),)
    _kgrouped_kernel[grid](a, b, c, sa, sb.float().contiguous(), offs, amax, seeds, index, n, k, a.stride(0),
                           b.stride(0), INTERPRET=INTERPRET, QUANT=bool(quant), **quant, **cfg)
    return c


def dequantize_triton(t: ref.NVFP4Tensor, block_r: int = 32, block_c: int = 256) -> torch.Tensor:
    """bf16 [R, C] = e2m1(q) * sf (no global scale) from packed codes and E4M3 scales."""
    r, c = t.shape
    out = torch.empty(r, c, dtype=torch.bfloat16, device=t.data.device)
    bc = max(16, min(block_c, triton.next_power_of_2(c)))
    grid = (triton.cdiv(r, block_r), triton.cdiv(c, bc))
    _dequant_kernel[grid](t.data, t.scale.view(torch.uint8), out, r, c, BLOCK_R=block_r, BLOCK_C=bc, num_warps=4)
    return out
