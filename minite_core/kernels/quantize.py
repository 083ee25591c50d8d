"""Fused NVFP4 quantize in Triton: x [M, K] (fp32 / bf16) -> packed E2M1 codes + E4M3 block scales + S_dec.

What: one kernel for every quantizer knob of `profiles.Quant` — 1×16 or 16×16 blocks, per-tensor or per-row
global scale, dynamic or static amax, `exact` or `fast` arithmetic, RNE or stochastic rounding, an optional
random Hadamard transform along K (wgrad operands), and optionally the exact bf16 copy `e2m1(q) * sf` (no
global scale) that the Hopper GEMM consumes (`kernels/gemm.py`).

Bit-exactness with `formats.nvfp4.quantize` (tests compare codes and scales with atol=0):
- every fp32 product is spelled in the reference's order; divisions use `div_rn` (Triton's `/` on fp32 is
  `div.full.f32`, ~2 ulp, which would change S_enc and enc); no a*b+c pattern exists, so FMA contraction
  cannot change a result;
- the E4M3 cast is done arithmetically (RNE on the fp32 bits for normals, `(v + 2^14) - 2^14` for the 2^-9
  subnormal grid) and the byte is assembled by hand, so neither the interpreter's nor the GPU's fp8 cast
  behaviour matters;
- E2M1 uses the reference's seven threshold compares (`formats/e2m1.py`), the RHT the reference's butterfly
  order (4 add/sub stages, then the exact x0.25).
Stochastic rounding draws Philox uniforms (`tl.rand(seed, element index)`) instead of a torch.Generator:
statistically equivalent (same p_up formula), not the same bits — tests check unbiasedness.

Amax (dynamic): per row it is fused — each program owns BLOCK_M full rows, loops over K once for the row
amax and once to quantize (the second read is served mostly by L2: a program's rows are BLOCK_M*K*2 bytes).
Per tensor it cannot be fused without a grid-wide barrier, so a first kernel writes the row amax [M] and
`torch.amax` reduces it (deterministic; 1.5x the input reads). A static amax skips that pass entirely.
With 16×16 tiles, 16 rows share a scale tile, so BLOCK_M is fixed at 16 there.
K is a constexpr (one compile per layer width; also what keeps TRITON_INTERPRET working with numpy >= 2.4,
whose int() of a size-1 array — the interpreter's runtime loop bound — raises).

KERNELS notes (H200, results/h200/bench/kernels.json, x = 16384x4096 bf16, medians of one run):
D2D copy of x: 0.072 ms (3.73 TB/s read+write). Quantize: 1x16 row-dynamic 0.21-0.25 ms (+bf16 dq copy:
0.24 ms), tensor-dynamic (amax pass + quantize) 0.28 ms, tensor-static 0.38-0.39 ms (sic: slower than the
two-pass dynamic row kernel; first variant timed, wide p20-p80 0.33-0.46 — re-measure), 16x16 0.56 ms,
fast 0.38 ms, SR 0.75 ms (Philox costs), RHT fused 0.28 ms. That is 0.6-1.3 TB/s of compulsory traffic, i.e.
~17-34% of copy bandwidth: the >= 70% target is NOT met. The kernel is instruction-bound, not memory-bound
(per element: 7 compares for E2M1, the [BM, BK/16, 16] reshape-reductions and the nibble split go through
layout conversions). Next steps: vectorise the encode on packed pairs, compute block amax with a
16-lane-contiguous layout (tl.reshape(can_reorder)), and a persistent grid. Tile sweep (row-dynamic):
(BLOCK_M, BLOCK_K, warps) = (16, 256, 4) 0.208 ms best; (4, 512, 4) 0.226; (8, 256, 4) 0.250;
(16, 512, 8) 0.246; (32, 256, 8) 0.260; (16, 128, 4) 0.265.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref

FLT_MAX = tl.constexpr(3.4028234663852886e38)
ONE_SIXTH_FP32 = tl.constexpr(0.1666666716337204)  # fp32(1/6), the reference's _ONE_SIXTH
# Tile defaults; the bench's sweep (bench/kernels.py "quantize-tile") re-measures them on the GPU.
BLOCK_M_DEFAULT, BLOCK_K_DEFAULT, NUM_WARPS_DEFAULT = 16, 256, 4


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
def _load_tile(x_ptr, rows, cols, M, K, stride_xm, RHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if RHT:
        x = _rht16(x, BLOCK_M, BLOCK_K)
    return x


@triton.jit
def _global_scales(amax):
    """S_enc = min(2688 / amax, FLT_MAX) (one correctly rounded division); amax == 0 or S_enc == 0 -> 1."""
    s_enc = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
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
def _e2m1_mag(c):
    """Magnitude of codes 0..7 (int32) as fp32."""
    return tl.where(c < 4, c.to(tl.float32) * 0.5, tl.where(c == 7, 6.0, (c - 2).to(tl.float32)))


@triton.jit
def _quantize_kernel(
    x_ptr, data_ptr, scale_ptr, sdec_ptr, dq_ptr, amax_ptr,
    M, K: tl.constexpr, stride_xm, seed,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    TWO_D: tl.constexpr, ROW_SCALE: tl.constexpr, FUSED_AMAX: tl.constexpr,
    FAST: tl.constexpr, SR: tl.constexpr, RHT: tl.constexpr, EMIT_DQ: tl.constexpr,
):
    # M = rows, K = reduction dim, NB = BLOCK_K // 16 scale blocks per tile row
    NB: tl.constexpr = BLOCK_K // 16
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
    rmask = rows < M

    # ---- global scale: S_enc per row (row mode) or one per tensor, broadcast to (BM,)
    if FUSED_AMAX:  # dynamic per-row amax: first pass over K
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = _load_tile(x_ptr, rows, k0 + tl.arange(0, BLOCK_K), M, K, stride_xm, RHT, BLOCK_M, BLOCK_K)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    elif ROW_SCALE:
        amax = tl.load(amax_ptr + rows, mask=rmask, other=1.0)
    else:
        amax = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(amax_ptr)
    s_enc, s_dec = _global_scales(amax)  # (BM,)
    if ROW_SCALE:
        tl.store(sdec_ptr + rows, s_dec, mask=rmask)
    else:
        if pid == 0:
            tl.store(sdec_ptr, tl.max(s_dec, axis=0))

    # ---- quantize pass
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = _load_tile(x_ptr, rows, cols, M, K, stride_xm, RHT, BLOCK_M, BLOCK_K)  # (BM, BK) fp32
        bamax = tl.max(tl.reshape(tl.abs(x), [BLOCK_M, NB, 16]), axis=2)  # (BM, NB)
        if TWO_D:  # 16x16 tile amax, replicated on the tile's 16 rows (BLOCK_M == 16)
            bamax = tl.broadcast_to(tl.max(bamax, axis=0)[None, :], [BLOCK_M, NB])
        se = s_enc[:, None]
        if FAST:
            sf_hp = tl.minimum(se * (bamax * ONE_SIXTH_FP32), 448.0)
        else:
            sf_hp = tl.minimum(bamax * (se * ONE_SIXTH_FP32), 448.0)
        sf, sf_byte = _e4m3_rne(sf_hp)  # (BM, NB)
        denom = sf * s_dec[:, None]
        enc_raw = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
        if FAST:
            enc = tl.where(sf == 0.0, 0.0, enc_raw)
        else:
            enc = tl.minimum(enc_raw, FLT_MAX)
        v = tl.reshape(tl.reshape(x, [BLOCK_M, NB, 16]) * enc[:, :, None], [BLOCK_M, BLOCK_K])
        a = tl.abs(v)
        if SR:
            offs = (rows[:, None].to(tl.int64) * K + cols[None, :]).to(tl.uint32)
            u = tl.rand(seed, offs)
            a = tl.minimum(a, 6.0)
            lo_c = ((a >= 0.5).to(tl.int32) + (a >= 1.0).to(tl.int32) + (a >= 1.5).to(tl.int32)
                    + (a >= 2.0).to(tl.int32) + (a >= 3.0).to(tl.int32) + (a >= 4.0).to(tl.int32))
            lo = _e2m1_mag(lo_c)
            hi = _e2m1_mag(lo_c + 1)
            p_up = (a - lo) / (hi - lo)  # hi - lo is a power of two: exact either way
            mag = lo_c + (u < p_up).to(tl.int32)
            mag = tl.where(a >= 6.0, 7, mag)
        else:
            mag = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
                   + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
                   + (a > 5.0).to(tl.int32))
        code = mag | ((v < 0.0).to(tl.int32) << 3)  # (BM, BK)

        lo_n, hi_n = tl.split(tl.reshape(code, [BLOCK_M, BLOCK_K // 2, 2]))
        byte = (lo_n | (hi_n << 4)).to(tl.uint8)
        pcols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        pmask = rmask[:, None] & (pcols[None, :] < K // 2)
        tl.store(data_ptr + rows[:, None].to(tl.int64) * (K // 2) + pcols[None, :], byte, mask=pmask)
        scols = k0 // 16 + tl.arange(0, NB)
        smask = rmask[:, None] & (scols[None, :] < K // 16)
        tl.store(scale_ptr + rows[:, None].to(tl.int64) * (K // 16) + scols[None, :], sf_byte.to(tl.uint8), mask=smask)
        if EMIT_DQ:  # e2m1(q) * sf, exact in bf16
            val = _e2m1_mag(mag)
            val = tl.where(v < 0.0, -val, val)
            dq = tl.reshape(tl.reshape(val, [BLOCK_M, NB, 16]) * sf[:, :, None], [BLOCK_M, BLOCK_K])
            dmask = rmask[:, None] & (cols[None, :] < K)
            tl.store(dq_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], dq.to(tl.bfloat16), mask=dmask)


@triton.jit
def _row_amax_kernel(x_ptr, amax_ptr, M, K: tl.constexpr, stride_xm, RHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _load_tile(x_ptr, rows, k0 + tl.arange(0, BLOCK_K), M, K, stride_xm, RHT, BLOCK_M, BLOCK_K)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    tl.store(amax_ptr + rows, amax, mask=rows < M)


# ----------------------------------------------------------------------------------------------- launchers
def _block_k(k: int, block_k: int) -> int:
    return max(16, min(block_k, triton.next_power_of_2(k)))


def row_amax(x: torch.Tensor, *, rht: bool = False, block_m: int = BLOCK_M_DEFAULT, block_k: int = BLOCK_K_DEFAULT) -> torch.Tensor:
    """amax of |x| (after RHT along K when rht) per row, fp32 [M]."""
    m, k = x.shape
    out = torch.empty(m, dtype=torch.float32, device=x.device)
    bk = _block_k(k, block_k)
    _row_amax_kernel[(triton.cdiv(m, block_m),)](x, out, m, k, x.stride(0), RHT=rht, BLOCK_M=block_m, BLOCK_K=bk,
                                                 num_warps=NUM_WARPS_DEFAULT)
    return out


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
    four_over_six: str = "off",
    block_m: int = BLOCK_M_DEFAULT,
    block_k: int = BLOCK_K_DEFAULT,
    num_warps: int = NUM_WARPS_DEFAULT,
) -> tuple[ref.NVFP4Tensor, torch.Tensor | None]:
    """Launcher. Returns (NVFP4Tensor, bf16 e2m1(q)*sf [M, K] or None). Same arguments as the reference's
    `quantize` except `seed` (Philox, for rounding="sr") replaces `generator`, plus `rht` / `emit_dq`."""
    if four_over_six != "off":
        raise NotImplementedError("4over6 block-scale selection has no Triton kernel yet: run it with "
                                  "MINITE_KERNELS=reference (formats/four_over_six.py)")
    block = tuple(block)
    ref._validate(x, block, check)  # same ValueErrors as the reference (shape, K % 16, non-finite)
    if scale_mode not in ("tensor", "row") or math not in ("exact", "fast") or rounding not in ("rne", "sr"):
        raise ValueError(f"bad quantizer settings scale_mode={scale_mode!r} math={math!r} rounding={rounding!r}")
    if rounding == "sr" and seed is None:
        raise ValueError("rounding='sr' needs an explicit integer seed (no hidden global RNG)")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    two_d = block == (16, 16)
    bm = 16 if two_d else block_m
    bk = _block_k(k, block_k)
    dev = x.device
    data = torch.empty(m, k // 2, dtype=torch.uint8, device=dev)
    scale = torch.empty(m, k // 16, dtype=torch.float8_e4m3fn, device=dev)
    row = scale_mode == "row"
    sdec = torch.empty((m, 1) if row else (), dtype=torch.float32, device=dev)
    dq = torch.empty(m, k, dtype=torch.bfloat16, device=dev) if emit_dq else data  # dummy pointer when unused
    fused = row and amax is None
    if amax is None:
        amax_t = sdec if row else row_amax(x, rht=rht, block_m=bm, block_k=bk).amax()  # sdec: dummy, unread
    else:
        amax_t = ref._amax(torch.empty(m, 0, device=dev), scale_mode, amax)  # validated, [] or (M, 1)
        amax_t = amax_t.to(dev, torch.float32).contiguous()
    _quantize_kernel[(triton.cdiv(m, bm),)](
        x, data, scale.view(torch.uint8), sdec, dq, amax_t,
        m, k, x.stride(0), 0 if seed is None else int(seed) & 0x7FFFFFFF,
        BLOCK_M=bm, BLOCK_K=bk, TWO_D=two_d, ROW_SCALE=row, FUSED_AMAX=fused,
        FAST=math == "fast", SR=rounding == "sr", RHT=rht, EMIT_DQ=emit_dq, num_warps=num_warps,
    )
    return ref.NVFP4Tensor(data=data, scale=scale, global_scale=sdec), (dq if emit_dq else None)


def quantize_reference(x, *, block=(1, 16), scale_mode="tensor", amax=None, rounding="rne", math="exact",
                       seed=None, rht=False, emit_dq=False, check=True, four_over_six="off", **_tiles):
    """The plain torch reference behind the same signature (`formats`): RHT pre-pass, then `nvfp4.quantize`
    (or `four_over_six.quantize_4over6` when four_over_six is "mae" / "mse")."""
    from minite_core.formats.rht import rht as rht_fn

    if four_over_six != "off":
        from minite_core.formats.four_over_six import quantize_4over6

        if rounding != "rne" or math != "exact" or rht:
            raise ValueError(f"4over6 needs rounding='rne', math='exact' and no RHT, got rounding={rounding!r} "
                             f"math={math!r} rht={rht} (TE 2.20 refuses the same combinations)")
        t = quantize_4over6(x, block=block, scale_mode=scale_mode, amax=amax, err_mode=four_over_six, check=check)
        return t, (ref.dequantize_unscaled(t).to(torch.bfloat16) if emit_dq else None)
    gen = None
    if rounding == "sr":
        if seed is None:
            raise ValueError("rounding='sr' needs an explicit integer seed (no hidden global RNG)")
        gen = torch.Generator(device=x.device).manual_seed(int(seed))
    x_in = rht_fn(x) if rht else x
    t = ref.quantize(x_in, block=block, scale_mode=scale_mode, amax=amax, rounding=rounding, math=math,
                     generator=gen, check=check)
    return t, (ref.dequantize_unscaled(t).to(torch.bfloat16) if emit_dq else None)
