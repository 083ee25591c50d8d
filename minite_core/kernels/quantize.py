"""Fused NVFP4 quantize in Triton: x [M, K] (fp32 / bf16, any strides) -> packed E2M1 codes + E4M3 block scales
+ S_dec, optionally the exact bf16 copy `e2m1(q) * sf` (no global scale) that the Hopper GEMM consumes.

What: one kernel for every quantizer knob of `profiles.Quant` — 1×16 or 16×16 blocks, `exact` or `fast`
arithmetic, RNE or stochastic rounding, an optional random Hadamard transform along K (wgrad operands) — and
four sources of the global scale (`SCALE_SRC`):
  0 "tensor"   one amax for the tensor (dynamic: a row-amax pass + torch.amax; static: given);
  1 "row"      an amax per row, given ([M]): static per-token scales, and the MoE's per-expert per-tensor
               scales (every row of an expert gets its expert's amax, so each expert is quantized exactly as a
               tensor of its own);
  2 "row-dyn"  per-row dynamic amax computed in the kernel (per-token scales): each program owns BLOCK_M full
               rows and reads them twice (amax pass, then quantize; the second read mostly hits L2);
  3 "col-seg"  an amax per 16-column block, given ([K/16]): the column-wise (along-token) wgrad operands of the
               MoE, where K runs over tokens sorted by expert and every 16-block belongs to one expert.
Strides are arguments, so the along-token operand xᵀ is quantized straight from x [T, C] (a transposed view)
with no transpose copy.

Bit-exactness with `formats.nvfp4.quantize` (tests compare codes and scales with atol=0):
- every fp32 product is spelled in the reference's order; divisions use `div_rn` (Triton's `/` on fp32 is
  `div.full.f32`, ~2 ulp); no a*b+c pattern exists, so FMA contraction cannot change a result;
- the E4M3 cast is done arithmetically (RNE on the fp32 bits for normals, `(v + 2^14) - 2^14` for the 2^-9
  subnormal grid) and the byte is assembled by hand, so neither the interpreter's nor the GPU's fp8 cast matters;
- E2M1 rounds by region instead of the reference's threshold compares (`formats/e2m1.py`), same result: the grid
  is {0, .5, 1, 1.5, 2} (step 1/2), {3, 4} (step 1), {6} (step 2); RNE's ties-to-even *code* is round-half-even of
  |v| / step with the fp32 magic number (y + 2^23) - 2^23, SR's lo is floor(|v| / step) · step (powers of two:
  exact); the RHT uses the reference's butterfly order;
- non-finite input (the hot path skips the reference's check): every amax is a NaN-propagating max (`amax_nan`:
  `tl.max` drops NaN on the GPU, `max.NaN.f32` costs the same), a non-finite amax makes S_dec NaN and a block
  whose amax (or S_enc) is not finite gets the E4M3 NaN scale 0x7F (`block_scales`), as in the reference: an Inf
  never becomes a finite value, and S_dec = NaN is the per-tensor flag nn/nonfinite.py reads once a step;
- stochastic rounding draws `tl.randint4x(seed, (row << 32) + col // 4)` (output col % 4: one Philox call per 4
  elements), which `formats.philox.uniform_grid` reproduces bit for bit. With `seg_seed` the seed and the row (or,
  in "col-seg", the column) index come per row/column from arrays: each MoE expert draws from its own stream with
  expert-local indices, as the per-expert reference does (16-aligned segments: no group of 4 straddles two).

Measured speeds, tile sweeps and what limits each variant: results/h200/bench/NOTES.md (rows 6, 7, 12, 34, 35).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.kernels import interpret  # noqa: F401  (patches Triton's interpreter when TRITON_INTERPRET=1)

FLT_MAX = tl.constexpr(3.4028234663852886e38)
ONE_SIXTH_FP32 = tl.constexpr(0.1666666716337204)  # fp32(1/6), the reference's _ONE_SIXTH
# Tile defaults: the best of the bench's H200 sweep (bench/kernels.py "quantize-tile": 0.197 ms at 16384x4096).
BLOCK_M_DEFAULT, BLOCK_K_DEFAULT, NUM_WARPS_DEFAULT = 8, 256, 4
# `prefetch`: each K loop loads its next tile before it works on the current one, the same bits with twice the bytes
# in flight; off: 1.03-1.09x on the round-to-nearest rows, 0.95-0.97x on SR (NOTES row 34, the `+prefetch` rows).
PREFETCH_DEFAULT = False
SCALE_SRC = {"tensor": 0, "row": 1, "row-dyn": 2, "col-seg": 3}


@triton.jit
def _rht_stage(v, R: tl.constexpr, N: tl.constexpr, H: tl.constexpr):
    """One butterfly stage on [R, 16]: pairs (i, i + H) inside blocks of 2H -> (a + b, a - b)."""
    v4 = tl.reshape(v, [R, N, 2, H])
    sel = tl.arange(0, 2)[None, None, :, None]
    a = tl.sum(tl.where(sel == 0, v4, 0.0), axis=2)  # [R, N, H], one nonzero term: exact
    b = tl.sum(tl.where(sel == 1, v4, 0.0), axis=2)
    v4 = tl.where(sel == 0, (a + b)[:, :, None, :], (a - b)[:, :, None, :])
    return tl.reshape(v4, [R, 16])


@triton.jit
def _rht16(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Random Hadamard transform on each 16-chunk of the rows of x [BLOCK_M, BLOCK_K], in the reference's
    butterfly order: sign flip, then stages h = 1, 2, 4, 8 of (a + b, a - b), then x0.25 (exact)."""
    j = tl.arange(0, BLOCK_K) % 16
    # s = [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1]: negative at 3,5,6,7,8,9,10,12,14,15
    neg = (j == 3) | (j == 5) | (j == 6) | (j == 7) | (j == 8) | (j == 9) | (j == 10) | (j == 12) | (j == 14) | (j == 15)
    v = tl.where(neg[None, :], -x, x)
    R: tl.constexpr = BLOCK_M * BLOCK_K // 16
    v = tl.reshape(v, [R, 16])
    v = _rht_stage(v, R, 8, 1)
    v = _rht_stage(v, R, 4, 2)
    v = _rht_stage(v, R, 2, 4)
    v = _rht_stage(v, R, 1, 8)
    return tl.reshape(v * 0.25, [BLOCK_M, BLOCK_K])


@triton.jit
def _load_raw(x_ptr, rows, cols, M, K, stride_xm, stride_xk):
    """x's tile in its own dtype (zeros outside [M, K]): what a loop loads one tile ahead of its use."""
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :].to(tl.int64) * stride_xk
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _prep(raw, RHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    x = raw.to(tl.float32)
    if RHT:
        x = _rht16(x, BLOCK_M, BLOCK_K)
    return x


@triton.jit
def _k_tile(x_ptr, rows, k0, nxt, M, K, stride_xm, stride_xk, PREFETCH: tl.constexpr, RHT: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """A K loop's step: (the fp32 tile at k0, what the loop carries). With PREFETCH `nxt` is that tile, loaded one
    step ahead, and the tile at k0 + BLOCK_K is loaded now (past K: masked, no traffic); else `nxt` is a dummy."""
    if PREFETCH:
        raw, nxt = nxt, _load_raw(x_ptr, rows, k0 + BLOCK_K + tl.arange(0, BLOCK_K), M, K, stride_xm, stride_xk)
    else:
        raw = _load_raw(x_ptr, rows, k0 + tl.arange(0, BLOCK_K), M, K, stride_xm, stride_xk)
    return _prep(raw, RHT, BLOCK_M, BLOCK_K), nxt


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def amax_nan(x, axis):
    """max |x| along axis, NaN when any element is NaN (tl.max would drop it on the GPU: max.f32)."""
    return tl.reduce(tl.abs(x), axis, _max_nan)


@triton.jit
def _global_scales(amax):
    """S_enc = min(2688 / amax, FLT_MAX) (one correctly rounded division); amax == 0 or S_enc == 0 -> 1; a
    non-finite amax -> NaN (the reference's rule, spelled out: tl.minimum drops a NaN on the GPU)."""
    s_enc = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_enc = tl.where(amax <= FLT_MAX, s_enc, float("nan"))
    s_dec = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), s_enc)
    return s_enc, s_dec


@triton.jit
def _e4m3_rne(v):
    """RNE of non-negative fp32 v <= 448 onto the E4M3 grid; returns (value fp32, byte int32)."""
    bits = v.to(tl.int32, bitcast=True)
    nbits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # drop 20 mantissa bits, ties to even
    sub = (v + 16384.0) - 16384.0  # ulp(2^14) = 2^-9 = the subnormal step
    r = tl.where(v < 0.015625, sub, nbits.to(tl.float32, bitcast=True))
    rb = r.to(tl.int32, bitcast=True)
    byte = tl.where(r < 0.015625, (r * 512.0).to(tl.int32), (((rb >> 23) - 120) << 3) | ((rb >> 20) & 7))
    return r, byte


@triton.jit
def _e2m1_rne(a):
    """|v| (fp32, >= 0) -> (magnitude code 0..7 int32, its value fp32), round to nearest, ties to even code."""
    a = tl.minimum(a, 6.0)
    step = tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))
    r = (a / step + 8388608.0) - 8388608.0  # a / step is exact (a power-of-two step); RNE to an integer
    base = tl.where(a < 2.0, 0, tl.where(a < 4.0, 2, 4))  # code offset of the region
    return r.to(tl.int32) + base, r * step


@triton.jit
def _e2m1_mag(c):
    """Magnitude of codes 0..7 (int32) as fp32."""
    return tl.where(c < 4, c.to(tl.float32) * 0.5, tl.where(c == 7, 6.0, (c - 2).to(tl.float32)))


@triton.jit
def _to_uniform(x):
    """uint32 -> fp32 in [0, 1), as Triton's `uint_to_uniform_float` (and `formats.philox.to_uniform`)."""
    x = x.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, -x - 1, x)
    return x.to(tl.float32) * 4.6566127342e-10


@triton.jit
def _uniforms(seed, ctr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """u [BM, BK] from one randint4x per 4 columns; seed/ctr broadcast to [BM, BK // 4]; column c takes output c % 4."""
    r0, r1, r2, r3 = tl.randint4x(seed, ctr)
    u = tl.join(tl.join(r0, r2), tl.join(r1, r3))  # [BM, BK/4, 2, 2]: [..., a, b] = output 2a + b
    return _to_uniform(tl.reshape(u, [BLOCK_M, BLOCK_K]))


@triton.jit
def _sr_magnitude(a, u):
    """Stochastic rounding of |v| = a (fp32) with uniforms u: round up with probability (a - lo) / (hi - lo).
    By region, as `_e2m1_rne`: the grid step is a power of two (1/2 below 2, 1 below 4, 2 up to 6), so
    lo = floor(a / step) · step, a - lo (Sterbenz: lo >= step) and (a - lo) / step are exact — the reference's values
    (formats/e2m1.py `e2m1_encode_sr`) without its six threshold compares. A NaN gets code 7 (its block's scale is
    NaN: it decodes to NaN whatever its code)."""
    a = tl.minimum(a, 6.0)
    small, mid = a < 2.0, a < 4.0
    step = tl.where(small, 0.5, tl.where(mid, 1.0, 2.0))
    inv = tl.where(small, 2.0, tl.where(mid, 1.0, 0.5))
    f = tl.floor(a * inv)  # the index of lo in its region: 0..3
    p_up = (a - f * step) * inv
    mag = f.to(tl.int32) + tl.where(small, 0, tl.where(mid, 2, 4)) + (u < p_up).to(tl.int32)
    return tl.where(a < 6.0, mag, 7)


@triton.jit
def block_scales(bamax, se, sd, FAST: tl.constexpr):
    """Blocks with amax `bamax` under global scales se = S_enc, sd = S_dec (same shapes) -> (sf fp32, its E4M3
    byte, enc = the block's encode factor): DESIGN.md's `exact` or `fast` (FAST) order of operations. A block
    whose amax or S_enc is not finite gets scale NaN (byte 0x7F): it decodes to NaN, whatever its codes."""
    if FAST:
        sf_hp = tl.minimum(se * (bamax * ONE_SIXTH_FP32), 448.0)
    else:
        sf_hp = tl.minimum(bamax * (se * ONE_SIXTH_FP32), 448.0)
    sf, sf_byte = _e4m3_rne(sf_hp)
    finite = (bamax <= FLT_MAX) & (se <= FLT_MAX)  # False for inf and NaN
    sf = tl.where(finite, sf, float("nan"))
    sf_byte = tl.where(finite, sf_byte, 0x7F)
    denom = sf * sd
    enc_raw = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
    if FAST:
        enc = tl.where(sf == 0.0, 0.0, enc_raw)
    else:
        enc = tl.minimum(enc_raw, FLT_MAX)
    return sf, sf_byte, enc


@triton.jit
def quantize_dq_tile(x, s_enc, s_dec, FAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """x (BM, BK) fp32 with its rows' global scales (BM,) -> e2m1(q)·sf as bf16 (1x16 blocks, RNE): the values
    `_quantize_kernel` emits with EMIT_DQ, computed in registers (the decode GEMM's fused activation quantizer)."""
    return dq_tile(x, s_enc, s_dec, 0.0, FAST, False, BLOCK_M, BLOCK_K)


@triton.jit
def dq_tile(x, s_enc, s_dec, u, FAST: tl.constexpr, SR: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_K: tl.constexpr):
    """`quantize_dq_tile` with stochastic rounding too (SR: u (BM, BK) = the uniforms `_quantize_kernel` draws for
    these elements, `_uniforms`; unread otherwise): `_quantize_kernel`'s EMIT_DQ values term for term (the fused
    GEMMs' A prologue, kernels/quant_prologue.py)."""
    NB: tl.constexpr = BLOCK_K // 16
    se = tl.broadcast_to(s_enc[:, None], [BLOCK_M, NB])
    sd = tl.broadcast_to(s_dec[:, None], [BLOCK_M, NB])
    return dq_blocks(x, se, sd, u, FAST, SR, BLOCK_M, BLOCK_K)


@triton.jit
def dq_blocks(x, se, sd, u, FAST: tl.constexpr, SR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """`dq_tile` with the global scales given per 1x16 block: se = S_enc, sd = S_dec (BM, BK // 16) — per row
    (`dq_tile`) or per 16-column block (the wgrad's along-token operand, whose blocks take their expert's scale:
    kernels/quant_prologue.py `t_tile`)."""
    NB: tl.constexpr = BLOCK_K // 16
    bamax = amax_nan(tl.reshape(x, [BLOCK_M, NB, 16]), 2)  # (BM, NB)
    sf, _, enc = block_scales(bamax, se, sd, FAST)
    v = tl.reshape(tl.reshape(x, [BLOCK_M, NB, 16]) * enc[:, :, None], [BLOCK_M, BLOCK_K])
    if SR:
        val = _e2m1_mag(_sr_magnitude(tl.abs(v), u))
    else:
        _, val = _e2m1_rne(tl.abs(v))
    val = tl.where(v < 0.0, -val, val)
    return tl.reshape(tl.reshape(val, [BLOCK_M, NB, 16]) * sf[:, :, None], [BLOCK_M, BLOCK_K]).to(tl.bfloat16)


@triton.jit
def _quantize_kernel(
    x_ptr, data_ptr, scale_ptr, sdec_ptr, dq_ptr, amax_ptr, seed_ptr, index_ptr,
    M, K, stride_xm, stride_xk, seed, row0, col0,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TWO_D: tl.constexpr, SCALE_SRC: tl.constexpr,
    FAST: tl.constexpr, SR: tl.constexpr, SEG_SEED: tl.constexpr, RHT: tl.constexpr, EMIT_DQ: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    # M = rows, K = reduction dim, NB = BLOCK_K // 16 scale blocks per tile row; (row0, col0) = sr_origin
    NB: tl.constexpr = BLOCK_K // 16
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
    rmask = rows < M

    # ---- global scale per row (BM,) or per 16-block (col-seg, loaded in the K loop)
    if SCALE_SRC == 2:  # dynamic per-row amax: first pass over K
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        nxt = _load_raw(x_ptr, rows, tl.arange(0, BLOCK_K), M, K, stride_xm, stride_xk) if PREFETCH else rows
        for k0 in range(0, K, BLOCK_K):
            x, nxt = _k_tile(x_ptr, rows, k0, nxt, M, K, stride_xm, stride_xk, PREFETCH, RHT, BLOCK_M, BLOCK_K)
            amax = _max_nan(amax, amax_nan(x, 1))
    elif SCALE_SRC == 1:
        amax = tl.load(amax_ptr + rows, mask=rmask, other=1.0)
    else:
        amax = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(amax_ptr)
    s_enc_row, s_dec_row = _global_scales(amax)  # (BM,)
    if SCALE_SRC == 1 or SCALE_SRC == 2:
        tl.store(sdec_ptr + rows, s_dec_row, mask=rmask)
    elif SCALE_SRC == 0:
        if pid == 0:
            tl.store(sdec_ptr, tl.reduce(s_dec_row, 0, _max_nan))
    if SR:
        if SEG_SEED and SCALE_SRC != 3:  # per-row stream (MoE expert) and expert-local row index
            seed_r = tl.load(seed_ptr + rows, mask=rmask, other=0)[:, None]
            ctr_row = tl.load(index_ptr + rows, mask=rmask, other=0).to(tl.int64)[:, None] << 32
        else:
            seed_r = seed
            ctr_row = (rows.to(tl.int64) + row0)[:, None] << 32  # global row of a shard (sr_origin)

    # ---- quantize pass
    nxt = _load_raw(x_ptr, rows, tl.arange(0, BLOCK_K), M, K, stride_xm, stride_xk) if PREFETCH else rows
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x, nxt = _k_tile(x_ptr, rows, k0, nxt, M, K, stride_xm, stride_xk, PREFETCH, RHT, BLOCK_M, BLOCK_K)
        bamax = amax_nan(tl.reshape(x, [BLOCK_M, NB, 16]), 2)  # (BM, NB)
        if TWO_D:  # 16x16 tile amax, replicated on the tile's 16 rows (BLOCK_M == 16)
            bamax = tl.broadcast_to(tl.reduce(bamax, 0, _max_nan)[None, :], [BLOCK_M, NB])
        bcols = k0 // 16 + tl.arange(0, NB)
        if SCALE_SRC == 3:  # one amax per 16-column block
            s_enc_b, s_dec_b = _global_scales(tl.load(amax_ptr + bcols, mask=bcols < K // 16, other=0.0))
            se = tl.broadcast_to(s_enc_b[None, :], [BLOCK_M, NB])
            sd = tl.broadcast_to(s_dec_b[None, :], [BLOCK_M, NB])
        else:
            se = tl.broadcast_to(s_enc_row[:, None], [BLOCK_M, NB])
            sd = tl.broadcast_to(s_dec_row[:, None], [BLOCK_M, NB])
        sf, sf_byte, enc = block_scales(bamax, se, sd, FAST)  # (BM, NB)
        v = tl.reshape(tl.reshape(x, [BLOCK_M, NB, 16]) * enc[:, :, None], [BLOCK_M, BLOCK_K])
        a = tl.abs(v)
        if SR:
            c4 = k0 + tl.arange(0, BLOCK_K // 4) * 4  # first column of each group of 4
            if SEG_SEED and SCALE_SRC == 3:  # per-column stream (MoE expert) and expert-local column index
                cm = c4 < K
                seed_c = tl.load(seed_ptr + c4, mask=cm, other=0)[None, :]
                local4 = tl.load(index_ptr + c4, mask=cm, other=0).to(tl.int64)[None, :] >> 2
                u = _uniforms(seed_c, (rows.to(tl.int64)[:, None] << 32) + local4, BLOCK_M, BLOCK_K)
            else:
                u = _uniforms(seed_r, ctr_row + ((c4.to(tl.int64) + col0) >> 2)[None, :], BLOCK_M, BLOCK_K)
            mag = _sr_magnitude(a, u)
        else:
            mag, val = _e2m1_rne(a)
        code = mag | ((v < 0.0).to(tl.int32) << 3)  # (BM, BK)

        lo_n, hi_n = tl.split(tl.reshape(code, [BLOCK_M, BLOCK_K // 2, 2]))
        byte = (lo_n | (hi_n << 4)).to(tl.uint8)
        pcols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        pmask = rmask[:, None] & (pcols[None, :] < K // 2)
        tl.store(data_ptr + rows[:, None].to(tl.int64) * (K // 2) + pcols[None, :], byte, mask=pmask)
        smask = rmask[:, None] & (bcols[None, :] < K // 16)
        tl.store(scale_ptr + rows[:, None].to(tl.int64) * (K // 16) + bcols[None, :], sf_byte.to(tl.uint8), mask=smask)
        if EMIT_DQ:  # e2m1(q) * sf, exact in bf16
            if SR:
                val = _e2m1_mag(mag)
            val = tl.where(v < 0.0, -val, val)
            dq = tl.reshape(tl.reshape(val, [BLOCK_M, NB, 16]) * sf[:, :, None], [BLOCK_M, BLOCK_K])
            dmask = rmask[:, None] & (cols[None, :] < K)
            tl.store(dq_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], dq.to(tl.bfloat16), mask=dmask)


@triton.jit
def _row_amax_kernel(x_ptr, amax_ptr, M, K, stride_xm, stride_xk, RHT: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _prep(_load_raw(x_ptr, rows, k0 + tl.arange(0, BLOCK_K), M, K, stride_xm, stride_xk), RHT, BLOCK_M, BLOCK_K)
        amax = _max_nan(amax, amax_nan(x, 1))
    tl.store(amax_ptr + rows, amax, mask=rows < M)


@triton.jit
def _decode_scale_kernel(amax_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _, s_dec = _global_scales(tl.load(amax_ptr + i, mask=i < n, other=0.0))
    tl.store(out_ptr + i, s_dec, mask=i < n)


@triton.jit
def _block_amax_kernel(x_ptr, out_ptr, M, K, stride_xm, stride_xk, RHT: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """out[pid_m, j] = amax of |x| (after RHT along K) over rows of program pid_m and 16-column block j."""
    NB: tl.constexpr = BLOCK_K // 16
    pid_m, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    x = _prep(_load_raw(x_ptr, rows, cols, M, K, stride_xm, stride_xk), RHT, BLOCK_M, BLOCK_K)
    bamax = tl.reduce(amax_nan(tl.reshape(x, [BLOCK_M, NB, 16]), 2), 0, _max_nan)  # (NB,)
    bcols = pid_k * NB + tl.arange(0, NB)
    tl.store(out_ptr + pid_m.to(tl.int64) * (K // 16) + bcols, bamax, mask=bcols < K // 16)


# ----------------------------------------------------------------------------------------------- launchers
def _block_k(k: int, block_k: int) -> int:
    return max(16, min(block_k, triton.next_power_of_2(k)))


def _strides(x: torch.Tensor) -> tuple[int, int]:
    return x.stride(0), x.stride(1)


def row_amax(x: torch.Tensor, *, rht: bool = False, block_m: int = BLOCK_M_DEFAULT,
             block_k: int = BLOCK_K_DEFAULT) -> torch.Tensor:
    """amax of |x| (after RHT along K when rht) per row, fp32 [M]. x may be any 2D strided view."""
    m, k = x.shape
    out = torch.empty(m, dtype=torch.float32, device=x.device)
    _row_amax_kernel[(triton.cdiv(m, block_m),)](x, out, m, k, *_strides(x), RHT=rht, BLOCK_M=block_m,
                                                 BLOCK_K=_block_k(k, block_k), num_warps=NUM_WARPS_DEFAULT)
    return out


def decode_scale(amax: torch.Tensor) -> torch.Tensor:
    """`formats.nvfp4.global_decode_scale` (S_dec = 1 / S_enc per element, fp32, amax's shape) in one launch:
    the torch spelling is ~10 (a learner's MoE layer computes it ~12 times a step)."""
    a = amax.float().contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    _decode_scale_kernel[(triton.cdiv(n, 1024),)](a, out, n, BLOCK=1024)
    return out


def block_amax(x: torch.Tensor, *, rht: bool = False, block_m: int = 64, block_k: int = 128) -> torch.Tensor:
    """amax of |x| (after RHT along K when rht) per 16-column block over all rows, fp32 [K/16]."""
    m, k = x.shape
    bk = _block_k(k, block_k)
    grid = (triton.cdiv(m, block_m), triton.cdiv(k, bk))
    out = torch.empty(grid[0], k // 16, dtype=torch.float32, device=x.device)
    _block_amax_kernel[grid](x, out, m, k, *_strides(x), RHT=rht, BLOCK_M=block_m, BLOCK_K=bk,
                             num_warps=NUM_WARPS_DEFAULT)
    return out.amax(0)


def _sr_origin(origin, seg_seed) -> tuple[int, int]:
    """A data-parallel shard's SR counter offset (formats.nvfp4.quantize's sr_origin). The kernels draw one Philox
    call per 4 columns, so the column offset keeps groups of 4 whole; per-segment streams (seg_seed, the MoE
    experts) index their own rows and take none."""
    row0, col0 = (int(v) for v in origin)
    if col0 % 4 or row0 < 0 or col0 < 0:
        raise ValueError(f"sr_origin {tuple(origin)}: the Triton quantizers take a column offset that is a "
                         "non-negative multiple of 4 (a shard of whole 16-blocks)")
    if (row0 or col0) and seg_seed is not None:
        raise ValueError("sr_origin with seg_seed: per-segment SR streams index their own rows; pass one of them")
    return row0, col0


def quantize_triton(
    x: torch.Tensor,
    *,
    block: tuple[int, int] = (1, 16),
    scale_mode: str = "tensor",
    amax=None,
    rounding: str = "rne",
    math: str = "exact",
    seed: int | None = None,
    rht: bool = False,
    emit_dq: bool = False,
    check: bool = True,
    col_amax: torch.Tensor | None = None,
    seg_seed: tuple[torch.Tensor, torch.Tensor] | None = None,
    four_over_six: str = "off",
    sr_origin: tuple[int, int] = (0, 0),
    block_m: int = BLOCK_M_DEFAULT,
    block_k: int = BLOCK_K_DEFAULT,
    num_warps: int = NUM_WARPS_DEFAULT,
    prefetch: bool = PREFETCH_DEFAULT,
) -> tuple[ref.NVFP4Tensor, torch.Tensor | None]:
    """Launcher. Returns (NVFP4Tensor, bf16 e2m1(q)*sf [M, K] or None). Same arguments as the reference's
    `quantize` (`seed` = the Philox stream of rounding="sr"), plus `rht` / `emit_dq`, and for the MoE:
    `amax` of shape [M] with scale_mode="row" = one static amax per row; `col_amax` [K/16] = one amax per
    16-column block ("col-seg"; the returned global_scale is then empty: the caller owns the per-segment S_dec);
    `seg_seed` = (seeds int64, indices int64) per row — or per column with col_amax — for rounding="sr";
    `sr_origin` = (row, column) of x[0, 0] in the tensor x is a shard of (the reference's; column % 4 == 0);
    `prefetch`: load each K tile one iteration ahead (PREFETCH_DEFAULT)."""
    if four_over_six != "off":
        raise NotImplementedError("4over6 block-scale selection has no Triton kernel yet: run it with "
                                  "MINITE_KERNELS=reference (formats/four_over_six.py)")
    block = tuple(block)
    ref._validate(x, block, check)  # same ValueErrors as the reference (shape, K % 16, non-finite)
    if scale_mode not in ("tensor", "row") or math not in ("exact", "fast") or rounding not in ("rne", "sr"):
        raise ValueError(f"bad quantizer settings scale_mode={scale_mode!r} math={math!r} rounding={rounding!r}")
    if rounding == "sr" and seed is None and seg_seed is None:
        raise ValueError("rounding='sr' needs an explicit integer seed (no hidden global RNG)")
    row0, col0 = _sr_origin(sr_origin, seg_seed)
    m, k = x.shape
    two_d = block == (16, 16)
    bm = 16 if two_d else block_m
    bk = _block_k(k, block_k)
    dev = x.device
    data = torch.empty(m, k // 2, dtype=torch.uint8, device=dev)
    scale = torch.empty(m, k // 16, dtype=torch.float8_e4m3fn, device=dev)
    dq = torch.empty(m, k, dtype=torch.bfloat16, device=dev) if emit_dq else data  # dummy pointer when unused
    if col_amax is not None:
        src, amax_t = SCALE_SRC["col-seg"], col_amax.to(dev, torch.float32).contiguous()
        sdec = torch.empty(0, dtype=torch.float32, device=dev)
    elif scale_mode == "row":
        sdec = torch.empty((m, 1), dtype=torch.float32, device=dev)
        if amax is None:
            src, amax_t = SCALE_SRC["row-dyn"], sdec  # dummy, unread
        else:
            src = SCALE_SRC["row"]
            # the static amax's values are checked only with check=True (a host sync; nn's hot path passes False)
            amax_t = ref._amax(torch.empty(m, 0, device=dev), "row", amax, check).to(dev).contiguous()
    else:
        sdec = torch.empty((), dtype=torch.float32, device=dev)
        src = SCALE_SRC["tensor"]
        if amax is None:
            amax_t = row_amax(x, rht=rht, block_m=bm, block_k=bk).amax()
        else:
            amax_t = ref._amax(torch.empty(m, 0, device=dev), "tensor", amax, check)
            amax_t = amax_t.to(dev, torch.float32).contiguous()
    seeds, index = seg_seed if seg_seed is not None else (data, data)  # dummies when unused
    _quantize_kernel[(triton.cdiv(m, bm),)](
        x, data, scale.view(torch.uint8), sdec, dq, amax_t, seeds, index,
        m, k, *_strides(x), 0 if seed is None else int(seed), row0, col0,
        BLOCK_M=bm, BLOCK_K=bk, TWO_D=two_d, SCALE_SRC=src, FAST=math == "fast", SR=rounding == "sr",
        SEG_SEED=seg_seed is not None, RHT=rht, EMIT_DQ=emit_dq, PREFETCH=prefetch, num_warps=num_warps,
    )
    return ref.NVFP4Tensor(data=data, scale=scale, global_scale=sdec), (dq if emit_dq else None)
