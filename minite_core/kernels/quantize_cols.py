"""The along-token NVFP4 quantizer: x [T, C] in its natural row-major layout -> the codes of xᵀ [C, T] with 1×16
blocks along T — the wgrad operands (xᵀ saved for dW = dyᵀ x, and dyᵀ), read once, written transposed.

Why a kernel of its own: quantizing xᵀ through the row quantizer means reading x through a transposed view — the
16 elements of a block are 16 rows apart — and, under TE's recipe, running the RHT butterfly across that strided
axis (the H200 measured 7.7 ms per call for the amax pass alone at T = 133k, C = 2048).

How: a program owns G = BLOCK_T / 16 token blocks x BLOCK_C channels and holds the 16 tokens of its blocks as 16
separate (G, BLOCK_C) tensors, each loaded coalesced along C. Everything along T is then elementwise across those
16 tensors: the RHT butterfly (pairs of tensors), the block amax (a max of 16), the codes of a block and their
packing (8 bytes of one block = one int64 word of xᵀ's row; the bf16 copy: 4 tokens per int64 word). No value
crosses threads. Reshaping a [BLOCK_T, BLOCK_C] tile into [G, 16, BLOCK_C] for the butterfly, the block amax and
the packing instead makes each reshape, transpose and split a trip through shared memory: on the H200 at
Qwen3-30B-A3B shapes (4 layers, 16,384 tokens) that layout cost a learner step 187 ms in TE-NVFP4's RHT amax and
quantize passes and 42 ms in minite's (results/h200/bench/NOTES.md has the measurements of this kernel).

One read for a forward linear (`quantize_rows_cols_triton`, ROWS): the 16 token tensors a program holds are also
x's rows, so the same pass emits x's row-wise codes (1×16 along C, RNE, global scale per token or per tensor) with
their bf16 copy — the forward GEMM's operand — before the RHT (TE's recipe rotates only xᵀ); with SR, a gradient's
two operands, each with its own stream. What it saves is the row quantizer's read of x and its amax pass; the
arithmetic of both quantizations stays, and the H200 measured it no faster: 0.7-1.4x the two quantizers across runs
and tiles, 0.5-0.8x with SR, and a learner step 0.4-1.5% slower with it than without (bench/NOTES.md row 18). So the
learner (nn.linear, nn.experts) runs the two quantizers; this mode stays benched (`quantize-dual-*`) and checked.

Numerics are `quantize_triton`'s on xᵀ, bit for bit (same helpers: `_global_scales`, `block_scales`, `_e2m1_rne`,
`_sr_magnitude`, the reference's RHT butterfly order (its result rounded to bf16 under `rht_dtype="bfloat16"`),
and the SR stream `uniform_grid(seed, c, t)`: one Philox call per 4 tokens, output t % 4): global scale per tensor
(a scalar amax) or per 16-token block (`col_amax` [T/16], the MoE's per-expert scales); SR seeds either one seed
or, per token, (seed, expert-local token index) arrays (`seg_seed`). No K loop: a tile holds whole blocks.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.formats.rht import RHT_DTYPES
from minite_core.kernels.quantize import (
    _e2m1_mag,
    _e2m1_rne,
    _global_scales,
    _max_nan,
    _sr_magnitude,
    _sr_origin,
    _to_uniform,
    _uniforms,
    amax_nan,
    block_scales,
    decode_scale,
)

# Tiles (BLOCK_T, BLOCK_C, num_warps), H200 sweep of `bench kernels` (16384x4096 bf16, one run, medians; the copy of
# the same tensor 0.077 ms): the block-amax pass (64, 64, 4) 0.068 ms (0.083-0.10 elsewhere); codes only (minite's
# saved xᵀ) (64, 128, 8) 0.257 ms (0.26-0.42 elsewhere); SR + the bf16 copy (dyᵀ) (32, 64, 4) 0.474 ms, with TE's
# RHT 0.539 ms (0.55-0.90 elsewhere: the Philox draws and the dq words want more programs, fewer registers each).
AMAX_TILE, CODES_TILE, SR_DQ_TILE = (64, 64, 4), (64, 128, 8), (32, 64, 4)
# One read for x and xᵀ (quantize_rows_cols_triton, bench/NOTES.md row 18; H200 sweep at 16384x4096 incl. the amax
# pass, the separate quantizers 0.73 ms in that run, 0.39 ms in the next): minite's per-token rows (64, 256, 8)
# 0.53 ms (0.59-0.95 elsewhere); TE's RHT'd xᵀ (64, 64, 4) 0.66 ms (0.73-1.22 elsewhere).
DUAL_TILE, DUAL_RHT_TILE = (64, 256, 8), (64, 64, 4)


@triton.jit
def _row(x_ptr, g, c, T, C, stride_t, stride_c, J: tl.constexpr):
    """Token g * 16 + J of every 16-token block g (G,) and channel c (BC,): fp32 (G, BC)."""
    t = g * 16 + J
    mask = (t[:, None] < T) & (c[None, :] < C)
    return tl.load(x_ptr + t[:, None].to(tl.int64) * stride_t + c[None, :].to(tl.int64) * stride_c, mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _bfly(a, b):
    return a + b, a - b


@triton.jit
def _fin(v, RHT: tl.constexpr, RHT_BF16: tl.constexpr):
    """The butterfly's x1/4 (exact), then the optional bf16 rounding (formats.rht `dtype`)."""
    if RHT:
        v = v * 0.25
        if RHT_BF16:
            v = v.to(tl.bfloat16).to(tl.float32)
    return v


@triton.jit
def _raw16(x_ptr, g, c, T, C, stride_t, stride_c):
    """The 16 tokens of every block g as 16 (G, BC) fp32 tensors, each loaded coalesced along C."""
    return (_row(x_ptr, g, c, T, C, stride_t, stride_c, 0), _row(x_ptr, g, c, T, C, stride_t, stride_c, 1),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 2), _row(x_ptr, g, c, T, C, stride_t, stride_c, 3),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 4), _row(x_ptr, g, c, T, C, stride_t, stride_c, 5),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 6), _row(x_ptr, g, c, T, C, stride_t, stride_c, 7),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 8), _row(x_ptr, g, c, T, C, stride_t, stride_c, 9),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 10), _row(x_ptr, g, c, T, C, stride_t, stride_c, 11),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 12), _row(x_ptr, g, c, T, C, stride_t, stride_c, 13),
            _row(x_ptr, g, c, T, C, stride_t, stride_c, 14), _row(x_ptr, g, c, T, C, stride_t, stride_c, 15))


@triton.jit
def _rht_tokens(xs, RHT: tl.constexpr, RHT_BF16: tl.constexpr):
    """The RHT along the 16 tokens of (`_raw16`'s) xs when RHT, else xs: sign flip by
    s = [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1], then the stages h = 1, 2, 4, 8 of (a + b, a - b) on pairs
    (i, i + h) — formats.rht's butterfly, term for term — then x1/4. Every add pairs values one thread holds."""
    x0, x1, x2, x3 = xs[0], xs[1], xs[2], xs[3]
    x4, x5, x6, x7 = xs[4], xs[5], xs[6], xs[7]
    x8, x9, x10, x11 = xs[8], xs[9], xs[10], xs[11]
    x12, x13, x14, x15 = xs[12], xs[13], xs[14], xs[15]
    if RHT:
        x3, x5, x6, x7, x8, x9, x10, x12, x14, x15 = -x3, -x5, -x6, -x7, -x8, -x9, -x10, -x12, -x14, -x15
        x0, x1 = _bfly(x0, x1)
        x2, x3 = _bfly(x2, x3)
        x4, x5 = _bfly(x4, x5)
        x6, x7 = _bfly(x6, x7)
        x8, x9 = _bfly(x8, x9)
        x10, x11 = _bfly(x10, x11)
        x12, x13 = _bfly(x12, x13)
        x14, x15 = _bfly(x14, x15)
        x0, x2 = _bfly(x0, x2)
        x1, x3 = _bfly(x1, x3)
        x4, x6 = _bfly(x4, x6)
        x5, x7 = _bfly(x5, x7)
        x8, x10 = _bfly(x8, x10)
        x9, x11 = _bfly(x9, x11)
        x12, x14 = _bfly(x12, x14)
        x13, x15 = _bfly(x13, x15)
        x0, x4 = _bfly(x0, x4)
        x1, x5 = _bfly(x1, x5)
        x2, x6 = _bfly(x2, x6)
        x3, x7 = _bfly(x3, x7)
        x8, x12 = _bfly(x8, x12)
        x9, x13 = _bfly(x9, x13)
        x10, x14 = _bfly(x10, x14)
        x11, x15 = _bfly(x11, x15)
        x0, x8 = _bfly(x0, x8)
        x1, x9 = _bfly(x1, x9)
        x2, x10 = _bfly(x2, x10)
        x3, x11 = _bfly(x3, x11)
        x4, x12 = _bfly(x4, x12)
        x5, x13 = _bfly(x5, x13)
        x6, x14 = _bfly(x6, x14)
        x7, x15 = _bfly(x7, x15)
    return (_fin(x0, RHT, RHT_BF16), _fin(x1, RHT, RHT_BF16), _fin(x2, RHT, RHT_BF16), _fin(x3, RHT, RHT_BF16),
            _fin(x4, RHT, RHT_BF16), _fin(x5, RHT, RHT_BF16), _fin(x6, RHT, RHT_BF16), _fin(x7, RHT, RHT_BF16),
            _fin(x8, RHT, RHT_BF16), _fin(x9, RHT, RHT_BF16), _fin(x10, RHT, RHT_BF16), _fin(x11, RHT, RHT_BF16),
            _fin(x12, RHT, RHT_BF16), _fin(x13, RHT, RHT_BF16), _fin(x14, RHT, RHT_BF16), _fin(x15, RHT, RHT_BF16))


@triton.jit
def _load16(x_ptr, g, c, T, C, stride_t, stride_c, RHT: tl.constexpr, RHT_BF16: tl.constexpr):
    """The 16 tokens of every block g as 16 (G, BC) tensors, RHT'd along the tokens when RHT."""
    return _rht_tokens(_raw16(x_ptr, g, c, T, C, stride_t, stride_c), RHT, RHT_BF16)


@triton.jit
def _amax16(xs):
    """max over the 16 tokens of |x| (G, BC)."""
    m = tl.abs(xs[0])
    for j in tl.static_range(1, 16):
        m = _max_nan(m, tl.abs(xs[j]))  # NaN-propagating (quantize.py: non-finite input)
    return m


@triton.jit
def _col_block_amax_kernel(x_ptr, out_ptr, T, C, stride_t, stride_c, RHT: tl.constexpr, RHT_BF16: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[pid_c, j] = amax over the program's channels of |x| (after RHT) in 16-token block j."""
    G: tl.constexpr = BLOCK_T // 16
    pid_t, pid_c = tl.program_id(0), tl.program_id(1)
    g = pid_t * G + tl.arange(0, G)  # global 16-token block index
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    xs = _load16(x_ptr, g, c, T, C, stride_t, stride_c, RHT, RHT_BF16)
    bamax = tl.reduce(_amax16(xs), 1, _max_nan)  # (G,)
    tl.store(out_ptr + pid_c.to(tl.int64) * (T // 16) + g, bamax, mask=g < T // 16)


@triton.jit
def _code(x, enc, u, SR: tl.constexpr):
    """E2M1 code (sign in bit 3) and signed value of x * enc; u: the SR uniforms (unused without SR)."""
    v = x * enc
    a = tl.abs(v)
    if SR:
        mag = _sr_magnitude(a, u)
        val = _e2m1_mag(mag)
    else:
        mag, val = _e2m1_rne(a)
    neg = v < 0.0
    return mag | (neg.to(tl.int32) << 3), tl.where(neg, -val, val)


@triton.jit
def _bf16_bits(v):
    """bf16 bit pattern of fp32 v (RNE; exact for e2m1 * e4m3 values) as int64 in [0, 2^16)."""
    return v.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF


@triton.jit
def _row_codes(x, t, c0, T, C, rdata_ptr, rscale_ptr, rdq_ptr, rsdec_ptr, ramax_ptr, rseed_ptr, index_ptr, rseed,
               STORE_SDEC, ROW_AMAX: tl.constexpr, FAST: tl.constexpr, SR: tl.constexpr, SEG_SEED: tl.constexpr,
               G: tl.constexpr, BLOCK_C: tl.constexpr):
    """The row-wise (1x16 along C) codes, E4M3 scales and bf16 e2m1(q)·sf of tokens t (G,), channels c0 + [0, BC),
    from their values x (G, BC): `_quantize_kernel`'s arithmetic term for term, global scale per token
    (`ROW_AMAX`: ramax [T]) or one for the tensor (ramax [1]); SR draws `_quantize_kernel`'s stream (seed `rseed`, or
    per token `rseed_ptr` with the expert-local index `index_ptr`); STORE_SDEC: this program writes the tokens' S_dec
    (the tensor's is the same value from every program that writes it)."""
    NB: tl.constexpr = BLOCK_C // 16
    tmask = t < T
    if ROW_AMAX:
        amax = tl.load(ramax_ptr + t, mask=tmask, other=1.0)
    else:
        amax = tl.zeros([G], dtype=tl.float32) + tl.load(ramax_ptr)
    s_enc, s_dec = _global_scales(amax)  # (G,)
    if STORE_SDEC:
        if ROW_AMAX:
            tl.store(rsdec_ptr + t, s_dec, mask=tmask)
        else:
            tl.store(rsdec_ptr, tl.reduce(s_dec, 0, _max_nan))
    bamax = amax_nan(tl.reshape(x, [G, NB, 16]), 2)  # (G, NB)
    se = tl.broadcast_to(s_enc[:, None], [G, NB])
    sd = tl.broadcast_to(s_dec[:, None], [G, NB])
    sf, sf_byte, enc = block_scales(bamax, se, sd, FAST)
    v = tl.reshape(tl.reshape(x, [G, NB, 16]) * enc[:, :, None], [G, BLOCK_C])
    if SR:  # one Philox call per 4 columns at counter (row << 32) + column // 4
        c4 = c0 + tl.arange(0, BLOCK_C // 4) * 4
        if SEG_SEED:
            seed_r = tl.load(rseed_ptr + t, mask=tmask, other=0)[:, None]
            ctr_row = tl.load(index_ptr + t, mask=tmask, other=0).to(tl.int64)[:, None] << 32
        else:
            seed_r = rseed
            ctr_row = t.to(tl.int64)[:, None] << 32
        mag = _sr_magnitude(tl.abs(v), _uniforms(seed_r, ctr_row + (c4.to(tl.int64) >> 2)[None, :], G, BLOCK_C))
        val = _e2m1_mag(mag)
    else:
        mag, val = _e2m1_rne(tl.abs(v))
    neg = v < 0.0
    lo_n, hi_n = tl.split(tl.reshape(mag | (neg.to(tl.int32) << 3), [G, BLOCK_C // 2, 2]))
    t64 = t.to(tl.int64)[:, None]
    pc = (c0 // 2 + tl.arange(0, BLOCK_C // 2))[None, :]
    tl.store(rdata_ptr + t64 * (C // 2) + pc, (lo_n | (hi_n << 4)).to(tl.uint8), mask=tmask[:, None] & (pc < C // 2))
    bc = (c0 // 16 + tl.arange(0, NB))[None, :]
    tl.store(rscale_ptr + t64 * (C // 16) + bc, sf_byte.to(tl.uint8), mask=tmask[:, None] & (bc < C // 16))
    dq = tl.reshape(tl.reshape(tl.where(neg, -val, val), [G, NB, 16]) * sf[:, :, None], [G, BLOCK_C])
    c = (c0 + tl.arange(0, BLOCK_C))[None, :]
    tl.store(rdq_ptr + t64 * C + c, dq.to(tl.bfloat16), mask=tmask[:, None] & (c < C))


@triton.jit
def _quantize_cols_kernel(
    x_ptr, data_ptr, scale_ptr, dq_ptr, amax_ptr, seed_ptr, index_ptr,
    rdata_ptr, rscale_ptr, rdq_ptr, rsdec_ptr, ramax_ptr, rseed_ptr,
    T, C, stride_t, stride_c, seed, row0, col0, rseed,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PER_BLOCK: tl.constexpr, FAST: tl.constexpr,
    SR: tl.constexpr, SEG_SEED: tl.constexpr, RHT: tl.constexpr, RHT_BF16: tl.constexpr, EMIT_DQ: tl.constexpr,
    ROWS: tl.constexpr, ROW_AMAX: tl.constexpr, ROW_SR: tl.constexpr,
):
    # tile: G = BLOCK_T / 16 token blocks x BLOCK_C channels; each of the 16 tokens of a block is one (G, BC)
    # tensor, so the block amax, the codes of a block and their packing are elementwise across the 16 tensors
    # (no reshape, transpose or split: nothing crosses threads). Outputs are rows of xᵀ [C, T].
    # ROWS: the same read also emits x's row-wise codes (1x16 along C) and their bf16 copy (`_row_codes`).
    G: tl.constexpr = BLOCK_T // 16
    pid_t, pid_c = tl.program_id(0), tl.program_id(1)
    g = pid_t * G + tl.arange(0, G)  # global 16-token block index (G,)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    xs = _raw16(x_ptr, g, c, T, C, stride_t, stride_c)
    if ROWS:
        for j in tl.static_range(16):
            _row_codes(xs[j], g * 16 + j, pid_c * BLOCK_C, T, C, rdata_ptr, rscale_ptr, rdq_ptr, rsdec_ptr, ramax_ptr,
                       rseed_ptr, index_ptr, rseed, pid_c == 0, ROW_AMAX, FAST, ROW_SR, SEG_SEED, G, BLOCK_C)
    xs = _rht_tokens(xs, RHT, RHT_BF16)
    bamax = _amax16(xs)  # (G, BC)
    gmask = g < T // 16
    if PER_BLOCK:
        amax = tl.load(amax_ptr + g, mask=gmask, other=0.0)  # (G,)
    else:
        amax = tl.zeros([G], dtype=tl.float32) + tl.load(amax_ptr)
    s_enc, s_dec = _global_scales(amax)
    se = tl.broadcast_to(s_enc[:, None], [G, BLOCK_C])
    sd = tl.broadcast_to(s_dec[:, None], [G, BLOCK_C])
    sf, sf_byte, enc = block_scales(bamax, se, sd, FAST)  # (G, BC)

    c64 = c.to(tl.int64)[None, :]
    mask = gmask[:, None] & (c[None, :] < C)
    words = tl.zeros([G, BLOCK_C], dtype=tl.int64)  # the 16 codes of a block: 8 bytes, token 0 in the low nibble
    for m in tl.static_range(4):  # tokens 4m .. 4m+3 of each block: one Philox call (SR), one dq word
        if SR:  # element (row c, col t) of xᵀ: output t % 4 of Philox at counter (c << 32) + t // 4
            t4 = g * 16 + 4 * m  # (G,)
            if SEG_SEED:
                s4 = tl.load(seed_ptr + t4, mask=gmask, other=0)[:, None]
                l4 = tl.load(index_ptr + t4, mask=gmask, other=0).to(tl.int64)[:, None] >> 2
            else:
                s4 = seed
                l4 = ((t4.to(tl.int64) + col0) >> 2)[:, None]  # (row0, col0) = sr_origin in xᵀ's coordinates
            r0, r1, r2, r3 = tl.randint4x(s4, ((c.to(tl.int64) + row0)[None, :] << 32) + l4)  # (G, BC) each
            u0, u1, u2, u3 = _to_uniform(r0), _to_uniform(r1), _to_uniform(r2), _to_uniform(r3)
        else:
            u0, u1, u2, u3 = enc, enc, enc, enc  # unused
        k0, v0 = _code(xs[4 * m], enc, u0, SR)
        k1, v1 = _code(xs[4 * m + 1], enc, u1, SR)
        k2, v2 = _code(xs[4 * m + 2], enc, u2, SR)
        k3, v3 = _code(xs[4 * m + 3], enc, u3, SR)
        half = (k0 | (k1 << 4) | (k2 << 8) | (k3 << 12)).to(tl.int64)  # tokens 4m..4m+3: bytes 2m, 2m+1
        words = words | (half << (16 * m))
        if EMIT_DQ:  # e2m1(q) * sf, exact in bf16: 4 tokens = one 8-byte word of xᵀ's bf16 row
            dq = (_bf16_bits(v0 * sf) | (_bf16_bits(v1 * sf) << 16) | (_bf16_bits(v2 * sf) << 32)
                  | (_bf16_bits(v3 * sf) << 48))
            tl.store(dq_ptr.to(tl.pointer_type(tl.int64)) + c64 * (T // 4) + (g * 4 + m)[:, None], dq, mask=mask)
    tl.store(data_ptr.to(tl.pointer_type(tl.int64)) + c64 * (T // 16) + g[:, None], words, mask=mask)
    tl.store(scale_ptr + c64 * (T // 16) + g[:, None], sf_byte.to(tl.uint8), mask=mask)


# ----------------------------------------------------------------------------------------------- launchers
def _rht_bf16(rht_dtype: str) -> bool:
    if rht_dtype not in RHT_DTYPES:
        raise ValueError(f"rht_dtype must be one of {RHT_DTYPES}, got {rht_dtype!r}")
    return rht_dtype == "bfloat16"


def col_block_amax(x: torch.Tensor, *, rht: bool = False, rht_dtype: str = "float32", block_t: int = AMAX_TILE[0],
                   block_c: int = AMAX_TILE[1], num_warps: int = AMAX_TILE[2]) -> torch.Tensor:
    """amax of |x| (after RHT along T, rounded to `rht_dtype`) per 16-token block over all channels: fp32 [T/16].
    x: [T, C]."""
    t_len, c_len = x.shape
    grid = (triton.cdiv(t_len, block_t), triton.cdiv(c_len, block_c))
    out = torch.empty(grid[1], t_len // 16, dtype=torch.float32, device=x.device)
    _col_block_amax_kernel[grid](x, out, t_len, c_len, x.stride(0), x.stride(1), RHT=rht,
                                 RHT_BF16=_rht_bf16(rht_dtype), BLOCK_T=block_t, BLOCK_C=block_c, num_warps=num_warps)
    return out.amax(0)


def quantize_cols_triton(x: torch.Tensor, *, amax=None, col_amax: torch.Tensor | None = None, math: str = "exact",
                         rounding: str = "rne", seed: int | None = None, seg_seed=None, rht: bool = False,
                         rht_dtype: str = "float32", emit_dq: bool = False, block_t: int | None = None,
                         block_c: int | None = None, four_over_six: str = "off", sr_origin: tuple[int, int] = (0, 0),
                         check: bool = True, num_warps: int | None = None, rows: "_RowOutputs | None" = None):
    """x [T, C] -> (NVFP4Tensor of xᵀ [C, T] with 1×16 blocks along T, bf16 e2m1(q)·sf [C, T] or None).
    Global scale: `col_amax` [T/16] per 16-token block (returned global_scale is then empty: the caller owns
    the per-segment S_dec), else one amax for the tensor (`amax` static, or dynamic from `col_block_amax`).
    `sr_origin`: (row, column) of xᵀ[0, 0] in the xᵀ it is a shard of (a rank's tokens: (0, token offset)).
    check: validate a given amax's value (finite, >= 0: two host syncs; the hot path, dispatch, passes False)."""
    if four_over_six != "off":
        raise NotImplementedError("4over6 block-scale selection has no Triton kernel yet: run it with "
                                  "MINITE_KERNELS=reference (formats/four_over_six.py)")
    row0, col0 = _sr_origin(sr_origin, seg_seed)
    t_len, c_len = x.shape
    if t_len % 16:
        raise ValueError(f"the along-token quantizer needs T % 16 == 0 (pad the tokens), got x of shape {tuple(x.shape)}")
    if rounding == "sr" and seed is None and seg_seed is None:
        raise ValueError("rounding='sr' needs an explicit integer seed (no hidden global RNG)")
    dev = x.device
    data = torch.empty(c_len, t_len // 2, dtype=torch.uint8, device=dev)
    scale = torch.empty(c_len, t_len // 16, dtype=torch.float8_e4m3fn, device=dev)
    dq = torch.empty(c_len, t_len, dtype=torch.bfloat16, device=dev) if emit_dq else data
    if col_amax is not None:
        amax_t, sdec = col_amax.to(dev, torch.float32).contiguous(), torch.empty(0, dtype=torch.float32, device=dev)
    else:
        if amax is None:
            amax_t = col_block_amax(x, rht=rht, rht_dtype=rht_dtype).amax()
        else:
            amax_t = ref._amax(torch.empty(1, 0, device=dev), "tensor", amax, check).to(dev, torch.float32).contiguous()
        sdec = decode_scale(amax_t)
    seeds, index = seg_seed if seg_seed is not None else (data, data)  # dummies when unused
    tile = (SR_DQ_TILE if (emit_dq or rounding == "sr") else CODES_TILE if rows is None
            else DUAL_RHT_TILE if rht else DUAL_TILE)
    block_t, block_c, num_warps = (v if v is not None else d for v, d in zip((block_t, block_c, num_warps), tile))
    if block_t % 16:
        raise ValueError(f"block_t must be a multiple of 16 (whole 16-token blocks), got {block_t}")
    grid = (triton.cdiv(t_len, block_t), triton.cdiv(c_len, block_c))
    rows = _RowOutputs.none(data) if rows is None else rows
    _quantize_cols_kernel[grid](
        x, data, scale.view(torch.uint8), dq, amax_t, seeds, index, rows.data, rows.scale.view(torch.uint8), rows.dq,
        rows.sdec, rows.amax, rows.seeds, t_len, c_len, x.stride(0), x.stride(1), 0 if seed is None else int(seed),
        row0, col0, rows.seed, BLOCK_T=block_t, BLOCK_C=block_c, PER_BLOCK=col_amax is not None, FAST=math == "fast",
        SR=rounding == "sr", SEG_SEED=seg_seed is not None, RHT=rht, RHT_BF16=_rht_bf16(rht_dtype), EMIT_DQ=emit_dq,
        ROWS=rows.dq is not data, ROW_AMAX=rows.sdec.dim() == 2, ROW_SR=rows.sr, num_warps=num_warps)
    gs = sdec if col_amax is not None else sdec.reshape(())
    return ref.NVFP4Tensor(data=data, scale=scale, global_scale=gs), (dq if emit_dq else None)


class _RowOutputs(NamedTuple):
    """The row-wise outputs and inputs of a one-read call (`quantize_rows_cols_triton`); `none` = dummies (ROWS off).
    sr: stochastic rounding with `seed`, or per row with `seeds` (the per-token index is the along-token seg_seed's)."""
    data: torch.Tensor
    scale: torch.Tensor
    dq: torch.Tensor
    sdec: torch.Tensor
    amax: torch.Tensor
    seeds: torch.Tensor
    seed: int = 0
    sr: bool = False

    @staticmethod
    def none(dummy: torch.Tensor) -> "_RowOutputs":
        return _RowOutputs(dummy, dummy, dummy, dummy, dummy, dummy)


def quantize_rows_cols_triton(x: torch.Tensor, row_amax: torch.Tensor, *, amax=None,
                              col_amax: torch.Tensor | None = None, math: str = "exact", rounding: str = "rne",
                              row_seed: int | None = None, seed: int | None = None,
                              seg_seed: tuple[torch.Tensor, torch.Tensor] | None = None,
                              row_seeds: torch.Tensor | None = None, rht: bool = False, rht_dtype: str = "float32",
                              emit_dq: bool = False, block_t: int | None = None, block_c: int | None = None,
                              num_warps: int | None = None):
    """One read of x [T, C] (T % 16 == 0) for a linear's two operands of x: the row-wise codes of x (1×16 along C)
    with their bf16 e2m1(q)·sf — the forward GEMM's (dgrad's, for a gradient) — and the codes of xᵀ (1×16 along T,
    RHT'd first when `rht`) for wgrad, with their bf16 copy when `emit_dq`. Row global scale: per token when
    `row_amax` is [T] (scale_mode "row", or the MoE's per-expert scales repeated per row), else one for the tensor
    (`row_amax` [] or [1]). xᵀ's: `amax` (the tensor's; default: the max of `row_amax`, i.e. of |x|, valid without
    RHT) or `col_amax` [T/16] (per 16-token block). rounding="sr": the rows draw `row_seed` (or per row `row_seeds`,
    with seg_seed's per-token index), xᵀ draws `seed` (or `seg_seed`), each as its own quantizer would.
    Returns ((NVFP4Tensor of x, bf16 [T, C]), (NVFP4Tensor of xᵀ, bf16 [C, T] or None)) — bit for bit
    `quantize_triton(x, emit_dq=True)` with that amax and seed, and `quantize_cols_triton(x)`."""
    t_len, c_len = x.shape
    if c_len % 16:
        raise ValueError(f"row-wise 1x16 blocks need C % 16 == 0, got x of shape {tuple(x.shape)}")
    per_row = row_amax.numel() == t_len and row_amax.dim() == 1
    if not per_row and row_amax.numel() != 1:
        raise ValueError(f"row_amax must be [T] ({t_len}) or a scalar, got shape {tuple(row_amax.shape)}")
    sr = rounding == "sr"
    if sr and (row_seed is None) == (row_seeds is None or seg_seed is None):
        raise ValueError("rounding='sr' needs the rows' seed: row_seed, or row_seeds with seg_seed (per row)")
    if amax is None and col_amax is None:
        if rht:
            raise ValueError("with rht the amax of xᵀ is the RHT'd one: pass amax= or col_amax=")
        amax = row_amax.amax()
    dev = x.device
    ramax = row_amax.to(dev, torch.float32).reshape(-1).contiguous()
    data = torch.empty(t_len, c_len // 2, dtype=torch.uint8, device=dev)
    rows = _RowOutputs(data, torch.empty(t_len, c_len // 16, dtype=torch.float8_e4m3fn, device=dev),
                       torch.empty(t_len, c_len, dtype=torch.bfloat16, device=dev),
                       torch.empty((t_len, 1) if per_row else (), dtype=torch.float32, device=dev), ramax,
                       data if row_seeds is None else row_seeds, 0 if row_seed is None else int(row_seed), sr)
    cols = quantize_cols_triton(x, amax=amax, col_amax=col_amax, math=math, rounding=rounding, seed=seed,
                                seg_seed=seg_seed, rht=rht, rht_dtype=rht_dtype, emit_dq=emit_dq, block_t=block_t,
                                block_c=block_c, num_warps=num_warps, check=False, rows=rows)
    return (ref.NVFP4Tensor(data=rows.data, scale=rows.scale, global_scale=rows.sdec), rows.dq), cols
