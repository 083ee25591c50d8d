"""The A operand's NVFP4 quantizer as a GEMM prologue: the W4A4 GEMMs (kernels/grouped.py `grouped_gemm_quant`,
kernels/gemm.py `gemm_triton_quant`) load the raw activation x (bf16 / fp32) and quantize it in registers; the MoE
wgrad (kernels/grouped.py `kgrouped_gemm_quant`) does the same for dyᵀ along tokens (`t_tile`, last section).

What the GEMM computes: y = (x̂ @ b̂ᵀ) · S_x · S_b with x̂ = e2m1(q)·sf the 1×16 NVFP4 quantization of x along K —
each (BLOCK_M, BLOCK_K) tile of x, once loaded, is cut into its 1×16 blocks, each block's amax gives its E4M3 scale
under the row's global scale, the scaled values round to e2m1 (RNE, or stochastic rounding), and the bf16
e2m1(q)·sf goes to the bf16 tensor-core dot. The global amax comes from a read-only reduction before the GEMM
(a row-amax pass; per expert, its max over the expert's rows), as the separate quantizer gets it.

Why: the separate pass (`quantize_triton(..., emit_dq=True)`, then the GEMM on its `DqOperand`) writes the bf16
e2m1(q)·sf copy plus codes and scales (2.56 bytes an element) and the GEMM reads the copy back (2 more), plus a
launch; the fused GEMM reads x where it read the copy (the same 2 bytes for a bf16 x). What it pays instead: the
quantizer's arithmetic is redone by each of the N / BLOCK_N programs that read the same row tile (the separate
quantizer is instruction-bound, kernels/quantize.py's notes; SR adds a Philox call per 4 elements), and per-token
scales need a row-amax pass over x (2 bytes an element) that the separate quantizer did in its own kernel. Which
wins is for the GPU to say: bench/kernels.py's `moe-*-w4a4-*-fused` and `linear-w4a4-fwd-fused` rows.

Why it is exact — the fused GEMM's output equals the separate pass + the same GEMM's bit for bit, for one tile
config (not only to accumulation order):
- x̂'s bf16 values are the separate quantizer's EMIT_DQ copy, bit for bit: `quantize.dq_tile` is made of the same
  Triton helpers as `_quantize_kernel` (`block_scales`, `_e2m1_rne`, `_sr_magnitude`, `_global_scales`), each fp32
  operation in the reference's order, divisions correctly rounded, no a*b+c that FMA contraction could change
  (kernels/quantize.py's notes); a block is quantized whole (BLOCK_K % 16 == 0), so the tiling cannot matter;
- stochastic rounding draws `_quantize_kernel`'s stream: one `tl.randint4x(seed, (row << 32) + col // 4)` per 4
  columns, with per-row seeds and expert-local rows (`seg_seed`, the MoE's per-expert streams) or one seed and the
  global row (`a_stream`);
- the dot sees the identical bf16 tiles in the identical K order (the GEMM kernels take the prologue as a
  constexpr branch of the one kernel; the rest of the program is shared), and the epilogue is the same
  acc · (S_x · S_b) with S_x = `_global_scales` of the same amax. Blocks past K (masked loads of zeros) quantize
  to zeros, which is what the unfused kernel's masked loads read.
No RHT in the row-wise (along-K) prologue: the row-wise operands of every profile skip it.

The along-token sibling (`t_scales`, `t_tile`: kernels/grouped.py `kgrouped_gemm_quant`, the MoE wgrad): the A
operand of wgrad is dyᵀ quantized along tokens — 16-token blocks aligned to each expert's segment start, the
expert's global scale (its amax from `quantize_cols.col_block_amax`'s pass, one per expert), SR with per-token
(seed, expert-local token) streams, and under TE's recipe the RHT over each 16-token block first (rounded to bf16
with rht_dtype "bfloat16"). The K-grouped kernel loads dy [Tp, N] in its natural layout as the (BLOCK_N, BLOCK_T)
tile of dyᵀ it used to read from the separate pass's bf16 copy, and `t_tile` turns it into that copy's values:
- a tile holds whole blocks (the segment starts at a multiple of 16 and BLOCK_T % 16 == 0), so the tiling cannot
  matter; tokens past the segment's end load as zeros, whole blocks of them, which quantize to zeros — what the
  unfused kernel's masked loads read;
- the RHT is `quantize._rht16` (the reference's butterfly: sign flip, stages h = 1, 2, 4, 8 of (a + b, a - b),
  then x1/4, each value the same fp32 operation as `quantize_cols._rht_tokens`'s; only the sign of a zero can
  differ, which no amax, scale or code sees), then the same bf16 rounding;
- block amax, E4M3 scale, encode factor, rounding and the bf16 e2m1(q)·sf are `quantize.dq_blocks`, whose
  operations are `quantize_cols._quantize_cols_kernel`'s (`block_scales`, `_e2m1_rne`, `_sr_magnitude`) in the
  same order; the global scales are `_global_scales` of the same amax (`col_amax[g]` there is the expert's amax);
- SR draws `quantize_cols`'s stream: element (channel n, token t) takes output t % 4 of
  `tl.randint4x(seed[t4], (n << 32) + index[t4] // 4)`, t4 = t - t % 4, with seed / index the per-token arrays
  the separate pass reads (`_uniforms` joins the four outputs in that order).
The epilogue stays the kernel's: acc · (S_dyᵀ[e] · S_x[e]) with S_dyᵀ = the launcher's `decode_scale(amax)`, the
value the separate pass returns. Cost, as for the rows: the separate pass writes dyᵀ's codes, scales and bf16
copy (2.56 bytes an element) that the GEMM reads back (2); fused, each of the K / BLOCK_K programs sharing an
(expert, n) tile redoes the quantizer (with TE's RHT and a Philox call per 4 elements) — 8 at Qwen3-30B-A3B's
gate|up (K 2048, BLOCK_K 256), 3 at its down. The tile is reshaped to (BN, BT / 16, 16) for the block amax and
the butterfly, which on the GPU may move values between threads (kernels/quantize_cols.py measured that layout
slower for the standalone quantizer); the bench's `moe-*-w4a4-wgrad-*` rows measure what it costs here.
"""
from __future__ import annotations

import triton
import triton.language as tl

from minite_core.kernels.quantize import (
    _global_scales,
    _max_nan,
    _rht16,
    _uniforms,
    dq_blocks,
    dq_tile,
)


@triton.jit
def a_scales(amax_ptr, sdec_ptr, rows, rmask, store, first, AMAX_ROW: tl.constexpr, BLOCK_M: tl.constexpr):
    """(S_enc, S_dec) (BM,) of these rows' global scales from amax, one per row (AMAX_ROW) or one for the tensor.
    store: this program also writes S_x for the caller (nn.nonfinite's flag) — per row (rmask), or the tensor's
    one value when it is the `first` program (every row's is the same; a NaN-propagating max)."""
    if AMAX_ROW:
        amax = tl.load(amax_ptr + rows)
    else:
        amax = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(amax_ptr)
    s_enc, s_dec = _global_scales(amax)
    if store:
        if AMAX_ROW:
            tl.store(sdec_ptr + rows, s_dec, mask=rmask)
        elif first:
            tl.store(sdec_ptr, tl.reduce(s_dec, 0, _max_nan))
    return s_enc, s_dec


@triton.jit
def a_stream(seed_ptr, index_ptr, rows, seed, SEG_SEED: tl.constexpr):
    """SR stream of these rows, as `_quantize_kernel` draws it: (seed, counter's row part (row << 32)), per row
    from arrays (SEG_SEED: the expert's seed and expert-local row) or the scalar seed and the row itself (`rows`
    offset by a shard's sr_origin row)."""
    if SEG_SEED:
        seed_r = tl.load(seed_ptr + rows)[:, None]
        ctr_row = tl.load(index_ptr + rows).to(tl.int64)[:, None] << 32
    else:
        seed_r = seed
        ctr_row = rows.to(tl.int64)[:, None] << 32
    return seed_r, ctr_row


@triton.jit
def a_tile(x, s_enc, s_dec, seed_r, ctr_row, k0, FAST: tl.constexpr, SR: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """x's tile (BM, BK) at columns k0 + [0, BK) -> bf16 e2m1(q)·sf (module docstring): RNE, or SR with the uniforms
    of `_quantize_kernel`'s counters (row part ctr_row, column // 4)."""
    if SR:
        c4 = k0 + tl.arange(0, BLOCK_K // 4) * 4  # first column of each group of 4
        u = _uniforms(seed_r, ctr_row + (c4.to(tl.int64) >> 2)[None, :], BLOCK_M, BLOCK_K)
    else:
        u = 0.0
    return dq_tile(x.to(tl.float32), s_enc, s_dec, u, FAST, SR, BLOCK_M, BLOCK_K)


@triton.jit
def t_scales(amax_ptr, e, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """(S_enc, S_dec) (BN, BT // 16) of expert e's along-token blocks: `_global_scales` of its amax (amax_ptr [E]),
    the same for every block of its segment — computed once a program."""
    amax = tl.zeros([BLOCK_N, BLOCK_T // 16], dtype=tl.float32) + tl.load(amax_ptr + e)
    return _global_scales(amax)


@triton.jit
def t_tile(x, s_enc, s_dec, seed_ptr, index_ptr, n, t, t_end, FAST: tl.constexpr, SR: tl.constexpr,
           RHT: tl.constexpr, RHT_BF16: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """dyᵀ's tile x (BN, BT) — channels n (BN,), tokens t + [0, BT) of a segment ending at t_end, whole 16-token
    blocks — -> bf16 e2m1(q)·sf, `quantize_cols_triton`'s EMIT_DQ values (module docstring): RHT first (RHT; bf16
    rounding with RHT_BF16), then RNE or SR with the per-token streams seed / index (expert seed, expert-local
    token) the separate pass reads."""
    x = x.to(tl.float32)
    if RHT:
        x = _rht16(x, BLOCK_N, BLOCK_T)
        if RHT_BF16:
            x = x.to(tl.bfloat16).to(tl.float32)
    if SR:
        t4 = t + tl.arange(0, BLOCK_T // 4) * 4  # first token of each group of 4
        m4 = t4 < t_end
        seed_c = tl.load(seed_ptr + t4, mask=m4, other=0)[None, :]
        local4 = tl.load(index_ptr + t4, mask=m4, other=0).to(tl.int64)[None, :] >> 2
        u = _uniforms(seed_c, (n.to(tl.int64)[:, None] << 32) + local4, BLOCK_N, BLOCK_T)
    else:
        u = 0.0
    return dq_blocks(x, s_enc, s_dec, u, FAST, SR, BLOCK_N, BLOCK_T)


def check_a(x, amax, rounding: str, math: str, seeded: bool, rows: int):
    """The launchers' argument checks -> (amax fp32 contiguous [rows] or [1], whether it is per row)."""
    if x.shape[1] % 16 or x.stride(1) != 1:
        raise ValueError(f"the fused quantizer takes x [M, K] with K % 16 == 0 and unit stride along K, got shape "
                         f"{tuple(x.shape)} strides {x.stride()}")
    if math not in ("exact", "fast") or rounding not in ("rne", "sr"):
        raise ValueError(f"bad quantizer settings math={math!r} rounding={rounding!r}")
    if rounding == "sr" and not seeded:
        raise ValueError("rounding='sr' needs an explicit seed (seed= or seg_seed=; no hidden global RNG)")
    per_row = amax.ndim > 0
    amax = amax.float().reshape(-1).contiguous()
    if per_row and amax.numel() != rows:
        raise ValueError(f"amax: one per row [{rows}] or one [], got shape {tuple(amax.shape)}")
    return amax, per_row

