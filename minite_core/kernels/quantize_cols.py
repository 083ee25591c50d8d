"""The along-token NVFP4 quantizer: x [T, C] in its natural row-major layout -> the codes of xᵀ [C, T] with 1×16
blocks along T — the wgrad operands (xᵀ saved for dW = dyᵀ x, and dyᵀ), read once, written transposed.

Why a kernel of its own: quantizing xᵀ through the row quantizer means reading x through a transposed view — the
16 elements of a block are 16 rows apart — and, under TE's recipe, running the Hopper-unfriendly RHT butterfly on a
tile whose contiguous axis is the wrong one (the H200 measured 7.7 ms per call for the amax pass alone at
T = 133k, C = 2048). Here a program loads a [BLOCK_T, BLOCK_C] tile of x coalesced along C, transforms and
reduces along T inside registers (one 16-token block = 16 rows of the tile), and transposes only the finished
codes, scales and bf16 copy on their way out.

Numerics are `quantize_triton`'s on xᵀ, bit for bit (same helpers: `_global_scales`, `_e4m3_rne`, `_e2m1_rne`,
`_sr_magnitude`, the RHT butterfly order (its result rounded to bf16 under `rht_dtype="bfloat16"`), and the SR stream `uniform_grid(seed, c, t)`): global scale per tensor
(a scalar amax) or per 16-token block (`col_amax` [T/16], the MoE's per-expert scales); SR seeds either one
seed or, per token, (seed, expert-local token index) arrays (`seg_seed`). No K loop: a tile holds whole blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minite_core.formats import nvfp4 as ref
from minite_core.formats.rht import RHT_DTYPES
from minite_core.kernels.quantize import (
    ONE_SIXTH_FP32,
    _e2m1_mag,
    _e2m1_rne,
    _e4m3_rne,
    _global_scales,
    _sr_magnitude,
    _sr_origin,
    _to_uniform,
)

BLOCK_T_DEFAULT, BLOCK_C_DEFAULT = 64, 64


@triton.jit
def _rht_rows_stage(v, G: tl.constexpr, N: tl.constexpr, H: tl.constexpr, BC: tl.constexpr):
    """One butterfly stage along axis 1 of v [G, 16, BC]: pairs (i, i + H) inside blocks of 2H -> (a + b, a - b)."""
    v5 = tl.reshape(v, [G, N, 2, H, BC])
    sel = tl.arange(0, 2)[None, None, :, None, None]
    a = tl.sum(tl.where(sel == 0, v5, 0.0), axis=2)  # one nonzero term: exact
    b = tl.sum(tl.where(sel == 1, v5, 0.0), axis=2)
    v5 = tl.where(sel == 0, (a + b)[:, :, None, :, :], (a - b)[:, :, None, :, :])
    return tl.reshape(v5, [G, 16, BC])


@triton.jit
def _load_rht(x_ptr, t, c, T, C, stride_t, stride_c, RHT: tl.constexpr, RHT_BF16: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """x tile [BT, BC] (fp32), RHT'd along T in 16-token chunks when RHT (the reference's butterfly order), the
    result rounded to bf16 (RNE) when RHT_BF16 (formats.rht `dtype`)."""
    mask = (t[:, None] < T) & (c[None, :] < C)
    x = tl.load(x_ptr + t[:, None].to(tl.int64) * stride_t + c[None, :].to(tl.int64) * stride_c, mask=mask,
                other=0.0).to(tl.float32)
    if RHT:
        G: tl.constexpr = BLOCK_T // 16
        j = tl.arange(0, BLOCK_T) % 16
        neg = (j == 3) | (j == 5) | (j == 6) | (j == 7) | (j == 8) | (j == 9) | (j == 10) | (j == 12) | (j == 14) | (j == 15)
        v = tl.reshape(tl.where(neg[:, None], -x, x), [G, 16, BLOCK_C])
        v = _rht_rows_stage(v, G, 8, 1, BLOCK_C)
        v = _rht_rows_stage(v, G, 4, 2, BLOCK_C)
        v = _rht_rows_stage(v, G, 2, 4, BLOCK_C)
        v = _rht_rows_stage(v, G, 1, 8, BLOCK_C)
        x = tl.reshape(v * 0.25, [BLOCK_T, BLOCK_C])
        if RHT_BF16:
            x = x.to(tl.bfloat16).to(tl.float32)
    return x


@triton.jit
def _col_block_amax_kernel(x_ptr, out_ptr, T, C, stride_t, stride_c, RHT: tl.constexpr, RHT_BF16: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[pid_c, j] = amax over the program's channels of |x| (after RHT) in 16-token block j."""
    G: tl.constexpr = BLOCK_T // 16
    pid_t, pid_c = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    x = _load_rht(x_ptr, t, c, T, C, stride_t, stride_c, RHT, RHT_BF16, BLOCK_T, BLOCK_C)
    bamax = tl.max(tl.max(tl.reshape(tl.abs(x), [G, 16, BLOCK_C]), axis=1), axis=1)  # (G,)
    blk = pid_t * G + tl.arange(0, G)
    tl.store(out_ptr + pid_c.to(tl.int64) * (T // 16) + blk, bamax, mask=blk < T // 16)


@triton.jit
def _quantize_cols_kernel(
    x_ptr, data_ptr, scale_ptr, dq_ptr, amax_ptr, seed_ptr, index_ptr,
    T, C, stride_t, stride_c, seed, row0, col0,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PER_BLOCK: tl.constexpr, FAST: tl.constexpr,
    SR: tl.constexpr, SEG_SEED: tl.constexpr, RHT: tl.constexpr, RHT_BF16: tl.constexpr, EMIT_DQ: tl.constexpr,
):
    # tile: tokens t (the reduction dim of xᵀ) x channels c (its rows); G = 16-token blocks in the tile
    G: tl.constexpr = BLOCK_T // 16
    pid_t, pid_c = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    x = _load_rht(x_ptr, t, c, T, C, stride_t, stride_c, RHT, RHT_BF16, BLOCK_T, BLOCK_C)  # (BT, BC)
    x3 = tl.reshape(x, [G, 16, BLOCK_C])
    bamax = tl.max(tl.abs(x3), axis=1)  # (G, BC)
    blk = pid_t * G + tl.arange(0, G)
    if PER_BLOCK:
        amax = tl.load(amax_ptr + blk, mask=blk < T // 16, other=0.0)  # (G,)
    else:
        amax = tl.zeros([G], dtype=tl.float32) + tl.load(amax_ptr)
    s_enc, s_dec = _global_scales(amax)
    se = tl.broadcast_to(s_enc[:, None], [G, BLOCK_C])
    sd = tl.broadcast_to(s_dec[:, None], [G, BLOCK_C])
    if FAST:
        sf_hp = tl.minimum(se * (bamax * ONE_SIXTH_FP32), 448.0)
    else:
        sf_hp = tl.minimum(bamax * (se * ONE_SIXTH_FP32), 448.0)
    sf, sf_byte = _e4m3_rne(sf_hp)  # (G, BC)
    denom = sf * sd
    enc_raw = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
    if FAST:
        enc = tl.where(sf == 0.0, 0.0, enc_raw)
    else:
        enc = tl.minimum(enc_raw, 3.4028234663852886e38)
    v = tl.reshape(x3 * enc[:, None, :], [BLOCK_T, BLOCK_C])
    a = tl.abs(v)
    if SR:  # element (row c, col t) of xᵀ: output t % 4 of Philox at counter (c << 32) + t_local // 4
        t4 = pid_t * BLOCK_T + tl.arange(0, BLOCK_T // 4) * 4  # first token of each group of 4
        if SEG_SEED:
            tm = t4 < T
            s4 = tl.load(seed_ptr + t4, mask=tm, other=0)[:, None]
            l4 = tl.load(index_ptr + t4, mask=tm, other=0).to(tl.int64)[:, None] >> 2
        else:
            s4 = seed
            l4 = ((t4.to(tl.int64) + col0) >> 2)[:, None]  # (row0, col0) = sr_origin in xᵀ's coordinates
        r0, r1, r2, r3 = tl.randint4x(s4, ((c.to(tl.int64) + row0)[None, :] << 32) + l4)  # (BT/4, BC) each
        u = tl.join(tl.join(r0, r2), tl.join(r1, r3))  # (BT/4, BC, 2, 2): [..., p, q] = output 2p + q
        u = _to_uniform(tl.reshape(tl.permute(u, (0, 2, 3, 1)), [BLOCK_T, BLOCK_C]))
        mag = _sr_magnitude(a, u)
        val = _e2m1_mag(mag)
    else:
        mag, val = _e2m1_rne(a)
    code = tl.trans(mag | ((v < 0.0).to(tl.int32) << 3))  # (BC, BT): rows of xᵀ
    lo, hi = tl.split(tl.reshape(code, [BLOCK_C, BLOCK_T // 2, 2]))
    c64 = c.to(tl.int64)[:, None]
    half = pid_t * (BLOCK_T // 2) + tl.arange(0, BLOCK_T // 2)
    cmask = c[:, None] < C
    tl.store(data_ptr + c64 * (T // 2) + half[None, :], (lo | (hi << 4)).to(tl.uint8), mask=cmask & (half[None, :] < T // 2))
    tl.store(scale_ptr + c64 * (T // 16) + blk[None, :], tl.trans(sf_byte).to(tl.uint8),
             mask=cmask & (blk[None, :] < T // 16))
    if EMIT_DQ:  # e2m1(q) * sf, exact in bf16
        val = tl.where(v < 0.0, -val, val)
        dq = tl.reshape(tl.reshape(val, [G, 16, BLOCK_C]) * sf[:, None, :], [BLOCK_T, BLOCK_C])
        tl.store(dq_ptr + c64 * T + t[None, :], tl.trans(dq).to(tl.bfloat16), mask=cmask & (t[None, :] < T))


# ----------------------------------------------------------------------------------------------- launchers
def _rht_bf16(rht_dtype: str) -> bool:
    if rht_dtype not in RHT_DTYPES:
        raise ValueError(f"rht_dtype must be one of {RHT_DTYPES}, got {rht_dtype!r}")
    return rht_dtype == "bfloat16"


def col_block_amax(x: torch.Tensor, *, rht: bool = False, rht_dtype: str = "float32", block_t: int = BLOCK_T_DEFAULT,
                   block_c: int = BLOCK_C_DEFAULT) -> torch.Tensor:
    """amax of |x| (after RHT along T, rounded to `rht_dtype`) per 16-token block over all channels: fp32 [T/16].
    x: [T, C]."""
    t_len, c_len = x.shape
    grid = (triton.cdiv(t_len, block_t), triton.cdiv(c_len, block_c))
    out = torch.empty(grid[1], t_len // 16, dtype=torch.float32, device=x.device)
    _col_block_amax_kernel[grid](x, out, t_len, c_len, x.stride(0), x.stride(1), RHT=rht,
                                 RHT_BF16=_rht_bf16(rht_dtype), BLOCK_T=block_t, BLOCK_C=block_c, num_warps=4)
    return out.amax(0)


def quantize_cols_triton(x: torch.Tensor, *, amax=None, col_amax: torch.Tensor | None = None, math: str = "exact",
                         rounding: str = "rne", seed: int | None = None, seg_seed=None, rht: bool = False,
                         rht_dtype: str = "float32", emit_dq: bool = False, block_t: int = BLOCK_T_DEFAULT,
                         block_c: int = BLOCK_C_DEFAULT, four_over_six: str = "off", sr_origin: tuple[int, int] = (0, 0),
                         check: bool = True):
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
            amax_t = col_block_amax(x, rht=rht, rht_dtype=rht_dtype, block_t=block_t, block_c=block_c).amax()
        else:
            amax_t = ref._amax(torch.empty(1, 0, device=dev), "tensor", amax, check).to(dev, torch.float32).contiguous()
        sdec = torch.full((), 1.0, device=dev) / ref.global_encode_scale(amax_t)
    seeds, index = seg_seed if seg_seed is not None else (data, data)  # dummies when unused
    grid = (triton.cdiv(t_len, block_t), triton.cdiv(c_len, block_c))
    _quantize_cols_kernel[grid](
        x, data, scale.view(torch.uint8), dq, amax_t, seeds, index, t_len, c_len, x.stride(0), x.stride(1),
        0 if seed is None else int(seed), row0, col0, BLOCK_T=block_t, BLOCK_C=block_c, PER_BLOCK=col_amax is not None,
        FAST=math == "fast", SR=rounding == "sr", SEG_SEED=seg_seed is not None, RHT=rht, RHT_BF16=_rht_bf16(rht_dtype),
        EMIT_DQ=emit_dq, num_warps=4)
    gs = sdec if col_amax is not None else sdec.reshape(())
    return ref.NVFP4Tensor(data=data, scale=scale, global_scale=gs), (dq if emit_dq else None)
